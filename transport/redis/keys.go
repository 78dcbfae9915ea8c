package redis

import (
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode"
)

// keys derives every Redis key and channel name from the configuration, as
// kombu does. All names returned are already prefixed with the global key
// prefix, except where a function says otherwise.
type keys struct {
	prefix       string
	sep          string
	steps        []int
	unacked      string
	unackedIndex string
	unackedMutex string
	fanout       string // fanout channel prefix with {db} replaced, unprefixed
	patterns     bool
	dead         string
}

func newKeys(c Config, db int) keys {
	return keys{
		prefix:       c.GlobalKeyPrefix,
		sep:          c.Sep,
		steps:        c.PrioritySteps,
		unacked:      c.GlobalKeyPrefix + c.UnackedKey,
		unackedIndex: c.GlobalKeyPrefix + c.UnackedIndexKey,
		unackedMutex: c.GlobalKeyPrefix + c.UnackedMutexKey,
		fanout:       strings.ReplaceAll(c.FanoutPrefix, "{db}", strconv.Itoa(db)),
		patterns:     !c.NoFanoutPatterns,
		dead:         c.GlobalKeyPrefix + c.DeadLetterPrefix,
	}
}

// clampPriority limits a message priority to 0..9 as kombu's
// _get_message_priority does.
func clampPriority(p int) int { return min(max(p, 0), 9) }

// band returns the priority step a priority falls into: the largest step not
// above it (Python's steps[bisect(steps, p) - 1], including its wrap-around
// to the last step when p is below every step).
func (k keys) band(priority int) int {
	i := sort.Search(len(k.steps), func(i int) bool { return k.steps[i] > priority })
	i--
	if i < 0 {
		i = len(k.steps) - 1
	}
	return k.steps[i]
}

// queueBand names the unprefixed list of a queue's band: the queue name for
// band 0, "<queue><sep><band>" otherwise (kombu's _q_for_pri).
func (k keys) queueBand(queue string, priority int) string {
	if b := k.band(priority); b != 0 {
		return queue + k.sep + strconv.Itoa(b)
	}
	return queue
}

// list returns the prefixed list key for a message of the given priority.
func (k keys) list(queue string, priority int) string {
	return k.prefix + k.queueBand(queue, clampPriority(priority))
}

// consumeOrder returns the prefixed keys one pop visits, priority-major then
// queue, as kombu's _brpop_start orders its BRPOP keys.
func (k keys) consumeOrder(queues []string) []string {
	out := make([]string, 0, len(queues)*len(k.steps))
	for _, s := range k.steps {
		for _, q := range queues {
			out = append(out, k.prefix+k.queueBand(q, s))
		}
	}
	return out
}

// queueOfKey strips the global prefix and the band suffix from a popped key
// (kombu: key.rsplit(sep, 1)[0]).
func (k keys) queueOfKey(key string) string {
	key = strings.TrimPrefix(key, k.prefix)
	if i := strings.LastIndex(key, k.sep); i >= 0 {
		return key[:i]
	}
	return key
}

// bands returns the prefixed lists of every band of a queue.
func (k keys) bands(queue string) []string {
	out := make([]string, 0, len(k.steps))
	for _, s := range k.steps {
		key := k.prefix + k.queueBand(queue, s)
		if !slices.Contains(out, key) {
			out = append(out, key)
		}
	}
	return out
}

// binding returns the prefixed binding set of an exchange.
func (k keys) binding(exchange string) string { return k.prefix + "_kombu.binding." + exchange }

// bindingMember is kombu's binding set member: routing key, pattern and
// queue joined by sep.
func (k keys) bindingMember(routingKey, pattern, queue string) string {
	return routingKey + k.sep + pattern + k.sep + queue
}

// splitBinding splits a binding member into routing key, pattern and queue.
func (k keys) splitBinding(m string) (rk, pattern, queue string, ok bool) {
	parts := strings.SplitN(m, k.sep, 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// publishChannel is the prefixed pub/sub channel of a fanout publish
// (kombu's _get_publish_topic).
func (k keys) publishChannel(exchange, routingKey string) string {
	if routingKey != "" && k.patterns {
		return k.prefix + k.fanout + exchange + "/" + routingKey
	}
	return k.prefix + k.fanout + exchange
}

// subscribePattern is the prefixed PSUBSCRIBE pattern of a fanout binding
// (kombu replaces '#' by '*' in the binding key).
func (k keys) subscribePattern(exchange, bindingKey string) string {
	return k.publishChannel(exchange, strings.ReplaceAll(bindingKey, "#", "*"))
}

// deadList is the prefixed dead-letter list of a queue.
func (k keys) deadList(queue string) string { return k.dead + queue }

// topicPattern converts a topic binding key into the regular expression
// kombu stores as the binding's pattern (TopicExchange.key_to_pattern):
// words are split on '.', '*' becomes `.*?[^\.]` and '#' becomes `.*?`,
// every other non-alphanumeric character is backslash-escaped.
func topicPattern(bindingKey string) string {
	var b strings.Builder
	b.WriteString("^")
	for i, word := range strings.Split(bindingKey, ".") {
		if i > 0 {
			b.WriteString(`\.`)
		}
		switch word {
		case "*":
			b.WriteString(`.*?[^\.]`)
		case "#":
			b.WriteString(`.*?`)
		default:
			for _, r := range word {
				switch {
				case r == 0:
					b.WriteString(`\000`)
				case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '#' || r == '*':
					b.WriteRune(r)
				default:
					b.WriteByte('\\')
					b.WriteRune(r)
				}
			}
		}
	}
	b.WriteString("$")
	return b.String()
}

// topicMatcher matches routing keys against topic binding keys with kombu's
// semantics. Compiled expressions are cached (bounded).
type topicMatcher struct {
	mu    sync.Mutex
	cache map[string]*regexp.Regexp
}

const topicCacheMax = 1024

// match reports whether routingKey matches bindingKey. kombu matches the
// stored Python regex; the same expression is built here from the binding
// key, with literal text quoted for Go's regexp syntax.
func (m *topicMatcher) match(bindingKey, routingKey string) bool {
	m.mu.Lock()
	re, ok := m.cache[bindingKey]
	m.mu.Unlock()
	if !ok {
		var b strings.Builder
		b.WriteString("^")
		for i, word := range strings.Split(bindingKey, ".") {
			if i > 0 {
				b.WriteString(`\.`)
			}
			switch word {
			case "*":
				b.WriteString(`.*?[^\.]`)
			case "#":
				b.WriteString(`.*?`)
			default:
				b.WriteString(regexp.QuoteMeta(word))
			}
		}
		b.WriteString("$")
		var err error
		re, err = regexp.Compile(b.String())
		if err != nil {
			return false
		}
		m.mu.Lock()
		if m.cache == nil || len(m.cache) >= topicCacheMax {
			m.cache = make(map[string]*regexp.Regexp)
		}
		m.cache[bindingKey] = re
		m.mu.Unlock()
	}
	return re.MatchString(routingKey)
}
