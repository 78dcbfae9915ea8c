//go:build race

package dashboard

// raceEnabled: the race detector multiplies memory use, so the memory
// test's stated bound applies to builds without it.
const raceEnabled = true
