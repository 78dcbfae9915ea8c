package worker

import (
	"context"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Version is celeriac's version, reported in worker events (sw_ver) and
// remote-control stats.
const Version = publish.Version

const (
	eventExchange     = "celeryev"
	eventBatchMax     = 64
	eventQueueSize    = 8192
	defaultHeartbeat  = 2 * time.Second
	eventFlushTimeout = 5 * time.Second
)

// clock is the Lamport clock Celery's monitors order events by.
type clock = publish.Clock

// events sends Celery events (worker-online/heartbeat/offline and, when
// enabled, task events) to the celeryev exchange, where Flower and
// `celery events` listen. Events are buffered and sent by one goroutine, so
// a slow broker never slows tasks down; when the buffer is full, task
// events are dropped (and counted) rather than blocking the worker.
type events struct {
	w          *Worker
	pub        transport.Publisher
	clock      *clock
	taskEvents atomic.Bool
	pid        int64
	utcoffset  int64
	queue      chan map[string]any
	dropped    atomic.Int64
	wg         sync.WaitGroup
	stop       chan struct{}
	stopOnce   sync.Once
}

func newEvents(w *Worker, pub transport.Publisher, clk *clock) *events {
	_, off := time.Now().Zone()
	e := &events{
		w:         w,
		pub:       pub,
		clock:     clk,
		pid:       int64(os.Getpid()),
		utcoffset: int64(math.Floor(float64(-off) / 3600)), // Python: time.timezone // 3600
		queue:     make(chan map[string]any, eventQueueSize),
		stop:      make(chan struct{}),
	}
	e.taskEvents.Store(w.cfg.SendTaskEvents)
	return e
}

// start runs the sender and, unless disabled, the heartbeat.
func (e *events) start() {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.sendLoop()
	}()
	if !e.w.cfg.WithoutHeartbeat {
		e.send("worker-online", e.workerFields(e.w.cfg.heartbeat().Seconds()))
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			t := time.NewTicker(e.w.cfg.heartbeat())
			defer t.Stop()
			for {
				select {
				case <-t.C:
					e.send("worker-heartbeat", e.workerFields(e.w.cfg.heartbeat().Seconds()))
				case <-e.stop:
					return
				}
			}
		}()
	}
}

// close sends worker-offline, flushes and stops.
func (e *events) close() {
	e.stopOnce.Do(func() {
		if !e.w.cfg.WithoutHeartbeat {
			e.send("worker-offline", e.workerFields(e.w.cfg.heartbeat().Seconds()))
		}
		close(e.stop)
		e.wg.Wait()
	})
}

// workerFields are the fields of worker-* events.
func (e *events) workerFields(freq float64) map[string]any {
	e.w.mu.Lock()
	active := int64(len(e.w.active))
	e.w.mu.Unlock()
	return map[string]any{
		"freq":      freq,
		"active":    active,
		"processed": e.w.processed.Load(),
		"loadavg":   loadavg(),
		"sw_ident":  "celeriac",
		"sw_ver":    Version,
		"sw_sys":    strings.ToUpper(runtime.GOOS[:1]) + runtime.GOOS[1:],
	}
}

// taskOn reports whether task events are enabled; callers check it before
// building an event's fields, which costs more than the event is worth when
// nobody listens.
func (e *events) taskOn() bool { return e.taskEvents.Load() }

// task sends a task event if task events are enabled.
func (e *events) task(typ string, fields map[string]any) {
	if !e.taskEvents.Load() {
		return
	}
	e.send(typ, fields)
}

// send queues an event; the common fields and the clock are added here so
// that the clock follows the order of the calls.
func (e *events) send(typ string, fields map[string]any) {
	if fields == nil {
		fields = map[string]any{}
	}
	fields["type"] = typ
	fields["hostname"] = e.w.cfg.Hostname
	fields["utcoffset"] = e.utcoffset
	fields["pid"] = e.pid
	fields["clock"] = e.clock.Tick()
	fields["timestamp"] = float64(time.Now().UnixNano()) / 1e9
	select {
	case e.queue <- fields:
	default:
		if e.dropped.Add(1)%1000 == 1 {
			e.w.log.Warn("event buffer full; dropping events", zap.Int64("dropped", e.dropped.Load()))
		}
	}
}

func (e *events) sendLoop() {
	batch := make([]map[string]any, 0, eventBatchMax)
	flush := func() {
		if len(batch) == 0 {
			return
		}
		e.publish(batch)
		batch = batch[:0]
	}
	for {
		select {
		case ev := <-e.queue:
			batch = append(batch, ev)
			// Take whatever else is queued, as Celery's buffered dispatcher
			// does, and send task events together as task.multi.
			for len(batch) < eventBatchMax {
				select {
				case ev := <-e.queue:
					batch = append(batch, ev)
					continue
				default:
				}
				break
			}
			flush()
		case <-e.stop:
			for {
				select {
				case ev := <-e.queue:
					batch = append(batch, ev)
					if len(batch) == eventBatchMax {
						flush()
					}
				default:
					flush()
					return
				}
			}
		}
	}
}

// publish sends worker events one by one (their own routing keys) and task
// events as one task.multi list.
func (e *events) publish(batch []map[string]any) {
	var tasks []any
	for _, ev := range batch {
		typ, _ := ev["type"].(string)
		if strings.HasPrefix(typ, "task-") {
			tasks = append(tasks, ev)
			continue
		}
		e.publishOne(strings.ReplaceAll(typ, "-", "."), ev)
	}
	switch len(tasks) {
	case 0:
	case 1:
		typ, _ := tasks[0].(map[string]any)["type"].(string)
		e.publishOne(strings.ReplaceAll(typ, "-", "."), tasks[0])
	default:
		e.publishOne("task.multi", tasks)
	}
}

func (e *events) publishOne(routingKey string, body any) {
	data, err := protocol.Marshal(protocol.ContentTypeJSON, body)
	if err != nil {
		e.w.log.Warn("encoding an event failed", zap.String("routing_key", routingKey), zap.Error(err))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), eventFlushTimeout)
	defer cancel()
	err = e.pub.Publish(ctx, &transport.Publishing{
		Exchange:     eventExchange,
		ExchangeType: transport.Topic,
		RoutingKey:   routingKey,
		NoConfirm:    true,
		Message: protocol.Message{
			ContentType:     protocol.ContentTypeJSON,
			ContentEncoding: "utf-8",
			Headers:         map[string]any{"hostname": e.w.cfg.Hostname},
			Properties:      protocol.Properties{DeliveryMode: 1},
			Body:            data,
		},
	})
	if err != nil {
		e.w.log.Debug("publishing an event failed", zap.String("routing_key", routingKey), zap.Error(err))
	}
}

// loadavg reads /proc/loadavg; zeros where it is not available.
func loadavg() []any {
	out := []any{0.0, 0.0, 0.0}
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return out
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		if v, err := strconv.ParseFloat(f[i], 64); err == nil {
			out[i] = math.Round(v*100) / 100
		}
	}
	return out
}

// taskReceivedFields are the task-received event's fields.
func taskReceivedFields(m *protocol.TaskMessage) map[string]any {
	args, kwargs := m.ArgsRepr, m.KwargsRepr
	if args == "" {
		args = protocol.ReprArgs(m.Args)
	}
	if kwargs == "" {
		kwargs = protocol.ReprKwargs(m.Kwargs)
	}
	f := map[string]any{
		"uuid":      m.ID,
		"name":      m.Name,
		"args":      args,
		"kwargs":    kwargs,
		"root_id":   nilIfEmpty(m.RootID),
		"parent_id": nilIfEmpty(m.ParentID),
		"retries":   int64(m.Retries),
		"eta":       nil,
		"expires":   nil,
	}
	if !m.ETA.IsZero() {
		f["eta"] = protocol.FormatTime(m.ETA)
	}
	if !m.Expires.IsZero() {
		f["expires"] = protocol.FormatTime(m.Expires)
	}
	return f
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
