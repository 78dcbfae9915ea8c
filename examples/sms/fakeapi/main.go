// Command fakeapi runs the outbound-SMS example's flaky SMS provider
// (package smsapi) and prints, every second, what it saw in that second:
//
//	go run ./examples/sms/fakeapi -addr 127.0.0.1:8025 -fail 0.1
//
// POST / sends a message; GET /records lists every request as JSON.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/celeriac/celeriac/examples/sms/smsapi"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8025", "listen address")
	limit := flag.Int("limit", 5, "requests admitted per second; more get 429")
	fail := flag.Float64("fail", 0.1, "probability that an admitted request fails with 503")
	flag.Parse()
	if err := run(*addr, *limit, *fail); err != nil {
		fmt.Fprintln(os.Stderr, "fakeapi:", err)
		os.Exit(1)
	}
}

func run(addr string, limit int, fail float64) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	api := smsapi.NewServer(smsapi.Config{Limit: limit, FailureRate: fail})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Printf("fake SMS API on http://%s/ (%d requests/s, %.0f%% transient failures)\n", ln.Addr(), limit, fail*100)

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	seen := 0
	for {
		select {
		case <-tick.C:
			recs := api.Records()
			if len(recs) > seen {
				report(recs[seen:])
				seen = len(recs)
			}
		case err := <-errc:
			return err
		case <-ctx.Done():
			summary(api.Records())
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		}
	}
}

// report prints one second's requests by status.
func report(recs []smsapi.Record) {
	by := map[int]int{}
	for _, r := range recs {
		by[r.Status]++
	}
	fmt.Printf("%s  %2d requests: %2d sent, %2d × 429, %2d × 503, %2d × 400\n",
		recs[len(recs)-1].Time.Format("15:04:05"), len(recs), by[200], by[429], by[503], by[400])
}

// summary prints the whole run: requests and sends per one-second window
// from the first request, and the duration.
func summary(recs []smsapi.Record) {
	if len(recs) == 0 {
		return
	}
	var all, sent []time.Time
	by := map[int]int{}
	for _, r := range recs {
		all = append(all, r.Time)
		by[r.Status]++
		if r.Status == http.StatusOK && !r.Replayed {
			sent = append(sent, r.Time)
		}
	}
	fmt.Printf("\n%d requests in %.1f s: %d messages sent, %d × 429, %d × 503, %d × 400\n", len(all),
		all[len(all)-1].Sub(all[0]).Seconds(), len(sent), by[429], by[503], by[400])
	fmt.Printf("requests per second: %v\n", smsapi.PerWindow(all, time.Second))
}
