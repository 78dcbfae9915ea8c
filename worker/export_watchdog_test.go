package worker

// CancelConsumer runs the cancel_consumer control command, for tests of
// package worker_test.
func CancelConsumer(w *Worker, queue string) map[string]any { return w.cancelConsumer(queue) }
