package bench

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// It is 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// procSample is what /proc says of a process tree at one moment.
type procSample struct {
	cpu time.Duration // user + system time of every process in the tree
	rss int64         // resident set size summed over the tree, in bytes
}

// sampleTree reads the process tree rooted at pid. Processes that exit
// while it reads are skipped; a tree that is gone reads as zero.
func sampleTree(pid int) procSample {
	var s procSample
	for _, p := range treePIDs(pid) {
		cpu, rss, ok := readStat(p)
		if ok {
			s.cpu += cpu
			s.rss += rss
		}
	}
	return s
}

// treePIDs lists pid and its descendants. A prefork Python worker is a
// main process with pool children, and both count.
func treePIDs(root int) []int {
	children := map[int][]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return []int{root}
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := readPPID(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// statFields returns the fields of /proc/<pid>/stat after the command
// name, which may itself contain spaces and parentheses.
func statFields(pid int) ([]string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(string(b[i+1:])), true
}

func readPPID(pid int) (int, bool) {
	f, ok := statFields(pid)
	if !ok || len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// readStat returns a process's CPU time and RSS. Fields after the name
// (1-based in proc(5), state is 3): utime 14, stime 15, rss 24 (pages).
func readStat(pid int) (time.Duration, int64, bool) {
	f, ok := statFields(pid)
	if !ok || len(f) < 22 {
		return 0, 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	rss, err3 := strconv.ParseInt(f[21], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return time.Duration(ut+st) * clockTick, rss * int64(os.Getpagesize()), true
}

// rssWatch samples a process tree's RSS until stopped and keeps the peak.
type rssWatch struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak int64
	last int64
}

func watchRSS(pid int, every time.Duration) *rssWatch {
	w := &rssWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s := sampleTree(pid)
			w.mu.Lock()
			w.last = s.rss
			w.peak = max(w.peak, s.rss)
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// Peak returns the largest RSS seen so far.
func (w *rssWatch) Peak() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak
}

// Stop ends the sampling and returns the peak.
func (w *rssWatch) Stop() int64 {
	close(w.stop)
	<-w.done
	return w.Peak()
}
