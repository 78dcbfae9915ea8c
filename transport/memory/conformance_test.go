package memory_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/transport/transporttest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// features are the memory transport's answers to the suite's questions.
func features() transporttest.Features {
	return transporttest.Features{
		Priority:          transporttest.PriorityHigherFirst,
		RequeueAtHead:     true,
		ExtraProperties:   true,
		RejectDeadLetters: true,
		DeadLetterReason:  true,
		DeadLetterQueueArguments: func(string) map[string]any {
			return map[string]any{memory.ArgDeadLetterExchange: "dlx"}
		},
		Topics: transporttest.TopicAMQP,
		// Nothing lags in process: a short quiet window proves as much as a
		// long one on a network broker.
		Quiet: 50 * 1e6,
	}
}

func TestConformance(t *testing.T) {
	b := memory.NewBroker()
	transporttest.Run(t, func(testing.TB) transport.Transport {
		return memory.New(memory.Config{Broker: b})
	}, features())
	if s := b.Stats(); s.Ready != 0 || s.Unacked != 0 || s.Dead != 0 || s.Queues != 0 {
		t.Errorf("suite left state behind in the broker: %+v", s)
	}
}
