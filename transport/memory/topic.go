package memory

import "strings"

// topicMatch reports whether routing key key matches binding pattern with
// AMQP topic semantics: words are separated by dots, "*" matches exactly one
// word and "#" matches zero or more words. RabbitMQ's rules, not kombu's
// looser regex translation (where "*" may also span dots).
//
// It runs in O(len(pattern words) * len(key words)) time and memory, so a
// hostile pattern such as "#.#.#.#" cannot make routing slow.
func topicMatch(pattern, key string) bool {
	p := strings.Split(pattern, ".")
	k := strings.Split(key, ".")
	// cur[j] is true when the pattern words seen so far match k[:j].
	cur := make([]bool, len(k)+1)
	next := make([]bool, len(k)+1)
	cur[0] = true
	for _, w := range p {
		clear(next)
		switch w {
		case "#":
			// Zero or more words: next[j] = any cur[i] with i <= j.
			any := false
			for j := range cur {
				any = any || cur[j]
				next[j] = any
			}
		case "*":
			for j := 1; j < len(cur); j++ {
				next[j] = cur[j-1]
			}
		default:
			for j := 1; j < len(cur); j++ {
				next[j] = cur[j-1] && k[j-1] == w
			}
		}
		cur, next = next, cur
	}
	return cur[len(k)]
}
