package sql_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/sql"
	"github.com/celeriac/celeriac/protocol"
)

// A task result as Celery's database backend stores it in the PickleType
// column; Python's pickle.loads reads {'sum': 5}.
func ExampleEncodePickle() {
	p, err := sql.EncodePickle(map[string]any{"sum": int64(5)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q\n", p)
	// Output: "\x80\x03}(X\x03\x00\x00\x00sumK\x05u."
}

// The backend of result_backend = "db+postgresql+psycopg2://..." with
// result_extended = True and the tables in a schema of their own.
func ExampleNew() {
	ctx := context.Background()
	be, err := sql.New(ctx, sql.Config{
		URL:          "db+postgresql+psycopg2://celery:secret@db.example.com/results",
		Extended:     true,
		TableSchemas: map[string]string{"task": "celery", "group": "celery"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer be.Close()
	err = be.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{
		TaskID: "3f2c...", Status: protocol.StateSuccess, Result: int64(5), DateDone: time.Now()}})
	if err != nil {
		log.Fatal(err)
	}
}

// django-celery-results' tables (result_backend = "django-db"): the URL is
// the database of Django's DATABASES["default"].
func ExampleNew_django() {
	be, err := sql.New(context.Background(), sql.Config{
		URL:      "postgres://django:secret@db.example.com/app",
		Schema:   sql.Django,
		Extended: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer be.Close()
}

// A Go caller waiting for a task's result in Celery's database backend. A
// celeriac worker's store wakes it at once (NOTIFY); a row a Python worker
// writes is found by polling. (It needs a database, so it only compiles.)
func ExampleBackend_Wait() {
	ctx := context.Background()
	be, err := sql.New(ctx, sql.Config{URL: "db+postgresql://celery:secret@db.example.com/results"})
	if err != nil {
		log.Fatal(err)
	}
	defer be.Close()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	m, err := be.Wait(wctx, "3f2c...")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(m.Status, m.DateDone)
	// client.New(tr, client.Config{Backend: be}): AsyncResult.Get uses
	// this Wait.
}

// Reading the result column Celery's database backend writes: here
// pickle.dumps({"sum": 5, "when": datetime.datetime(2026, 1, 2, 3, 4, 5)},
// 5). A pickle naming any class outside the decoder's allow-list is
// refused, never run.
func ExampleDecodePickle() {
	p := []byte("\x80\x05\x95=\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x03sum\x94K\x05\x8c\x04when\x94\x8c\x08datetime\x94\x8c\x08datetime\x94\x93\x94C\n\x07\xea\x01\x02\x03\x04\x05\x00\x00\x00\x94\x85\x94R\x94u.")
	v, err := sql.DecodePickle(p)
	if err != nil {
		log.Fatal(err)
	}
	m := v.(map[string]any)
	fmt.Println(m["sum"], m["when"])

	_, err = sql.DecodePickle([]byte("cos\nsystem\n(S'echo pwned'\ntR."))
	fmt.Println(errors.Is(err, sql.ErrUnsafePickle))
	// Output:
	// 5 2026-01-02 03:04:05 +0000 UTC
	// true
}
