package beat

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var oracleCases = flag.Int("oracle-cases", 12000, "random crontab cases per Celery version in TestOracle")

// The oracle's zones: UTC, DST in both hemispheres, half-hour offsets and
// DST steps (Lord Howe), DST at midnight (Havana), a negative DST around
// Ramadan (Casablanca), 45-minute offsets (Chatham).
var oracleZones = []string{
	"UTC", "America/New_York", "Europe/London", "Europe/Berlin", "Australia/Sydney",
	"Australia/Lord_Howe", "America/Sao_Paulo", "Asia/Kolkata", "Pacific/Chatham",
	"America/St_Johns", "Asia/Tehran", "America/Havana", "Africa/Casablanca", "America/Santiago",
}

type oracleCase struct {
	Kind     string    `json:"kind"`
	Spec     [5]string `json:"spec,omitempty"`
	Every    int64     `json:"every,omitempty"`
	Relative bool      `json:"relative,omitempty"`
	Event    string    `json:"event,omitempty"`
	Lat      float64   `json:"lat,omitempty"`
	Lon      float64   `json:"lon,omitempty"`
	TZ       string    `json:"tz"`
	Last     int64     `json:"last"`
	Now      int64     `json:"now"`
	Deadline *float64  `json:"deadline"`
}

type oracleAnswer struct {
	Celery string  `json:"celery"`
	Rem    int64   `json:"rem"`
	Due    bool    `json:"due"`
	Next   float64 `json:"next"`
	Err    string  `json:"err"`
}

// python returns the interpreter and environment for a Celery version:
// Debian's 5.2.6 in the system Python, or the 5.5.2 .ci/setup unpacks.
func python(t *testing.T, version string) (string, []string) {
	t.Helper()
	bin := os.Getenv("CELERIAC_PYTHON")
	if bin == "" {
		bin = "/usr/bin/python3"
	}
	env := os.Environ()
	if version != "5.2" { // unpacked by .ci/setup, as the integration tests find them
		v := strings.ReplaceAll(version, ".", "")
		dir := os.Getenv("CELERIAC_CELERY" + v + "_DIR")
		if dir == "" {
			cache, _ := os.UserCacheDir()
			dir = filepath.Join(cache, "celeriac", "celery-"+version)
		}
		env = append(env, "PYTHONPATH="+filepath.Join(dir, "root", "usr", "lib", "python3", "dist-packages"))
	}
	out, err := exec.Command(bin, "-c", "import celery, ephem; print(celery.__version__)").CombinedOutput()
	if version != "5.2" {
		cmd := exec.Command(bin, "-c", "import celery, ephem; print(celery.__version__)")
		cmd.Env = env
		out, err = cmd.CombinedOutput()
	}
	if err != nil || !strings.HasPrefix(string(out), version+".") {
		msg := fmt.Sprintf("Python Celery %s with ephem not usable via %s: %v %s (run .ci/setup)", version, bin, err, out)
		if os.Getenv("CELERIAC_REQUIRE_BROKERS") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin, env
}

// askOracle runs testdata/oracle.py once for all cases.
func askOracle(t *testing.T, version string, cases []oracleCase) []oracleAnswer {
	t.Helper()
	bin, env := python(t, version)
	cmd := exec.Command(bin, "testdata/oracle.py")
	cmd.Env = env
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		w := bufio.NewWriter(stdin)
		enc := json.NewEncoder(w)
		for _, c := range cases {
			_ = enc.Encode(c)
		}
		_ = w.Flush()
		_ = stdin.Close()
	}()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var answers []oracleAnswer
	for sc.Scan() {
		var a oracleAnswer
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("oracle: %v: %s", err, sc.Bytes())
		}
		answers = append(answers, a)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("oracle.py: %v", err)
	}
	if len(answers) != len(cases)+1 || !strings.HasPrefix(answers[0].Celery, version+".") {
		t.Fatalf("oracle answered %d lines for %d cases (first %+v)", len(answers), len(cases), answers[0])
	}
	return answers[1:]
}

// transitions lists each zone's UTC offset changes from 2019 to 2031.
func transitions(loc *time.Location) []time.Time {
	var out []time.Time
	t := time.Date(2019, 1, 1, 0, 0, 0, 0, time.UTC)
	end := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	_, prev := t.In(loc).Zone()
	for ; t.Before(end); t = t.Add(time.Hour) {
		if _, off := t.In(loc).Zone(); off != prev {
			lo, hi := t.Add(-time.Hour), t
			for hi.Sub(lo) > time.Second {
				mid := lo.Add(hi.Sub(lo) / 2)
				if _, o := mid.In(loc).Zone(); o == prev {
					lo = mid
				} else {
					hi = mid
				}
			}
			out = append(out, hi)
			prev = off
		}
	}
	return out
}

// cronGen makes random crontab fields in Celery's syntax, mostly valid.
type cronGen struct {
	r      *rand.Rand
	months bool // month names (Celery 5.3+)
}

func (g cronGen) number(max, min int, names []string) string {
	if names != nil && g.r.IntN(4) == 0 {
		n := g.r.IntN(len(names))
		name := names[n]
		switch g.r.IntN(3) {
		case 0:
			name = strings.ToUpper(name[:1]) + name[1:]
		case 1:
			name += []string{"day", "s", "ember", "nesday"}[g.r.IntN(4)]
		}
		return name
	}
	if g.r.IntN(200) == 0 { // out of range
		return strconv.Itoa(min + max + g.r.IntN(3))
	}
	return strconv.Itoa(min + g.r.IntN(max))
}

func (g cronGen) part(max, min int, names []string) string {
	switch k := g.r.IntN(10); {
	case k < 2:
		return "*"
	case k < 5:
		return g.number(max, min, names)
	case k < 7:
		return g.number(max, min, names) + "-" + g.number(max, min, names)
	case k < 9:
		return "*/" + strconv.Itoa(1+g.r.IntN(max/2+1))
	default:
		return g.number(max, min, names) + "-" + g.number(max, min, names) + "/" + strconv.Itoa(1+g.r.IntN(max/2+1))
	}
}

func (g cronGen) field(max, min int, names []string, star int) string {
	if g.r.IntN(100) < star {
		return "*"
	}
	if g.r.IntN(300) == 0 {
		return []string{" 5", "1,,2", "*/", "1-", "-1", "*/0", "x", "1-2/", "*/2x", "3 ", "1_0", "1-5)"}[g.r.IntN(12)]
	}
	n := 1 + g.r.IntN(3)
	parts := make([]string, n)
	for i := range parts {
		parts[i] = g.part(max, min, names)
	}
	return strings.Join(parts, ",")
}

func (g cronGen) spec() [5]string {
	var monthNames []string
	if g.months {
		monthNames = []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
	}
	return [5]string{
		g.field(60, 0, nil, 15),
		g.field(24, 0, nil, 30),
		g.field(7, 0, []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}, 60),
		g.field(31, 1, nil, 65),
		g.field(12, 1, monthNames, 70),
	}
}

// instants picks a last run and a now: half near one of the zone's DST
// changes, the rest anywhere in 2020-2030; now mostly after last.
func instants(r *rand.Rand, trans []time.Time) (last, now time.Time) {
	if len(trans) > 0 && r.IntN(2) == 0 {
		t := trans[r.IntN(len(trans))]
		last = t.Add(time.Duration(r.Int64N(int64(6*time.Hour))) - 3*time.Hour)
	} else {
		last = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(r.Int64N(int64(10 * 365 * 24 * time.Hour))))
	}
	switch r.IntN(10) {
	case 0: // before the last run (a clock set back)
		now = last.Add(-time.Duration(r.Int64N(int64(2 * time.Hour))))
	case 1, 2, 3: // within minutes
		now = last.Add(time.Duration(r.Int64N(int64(10 * time.Minute))))
	case 4: // whole minutes, as beat's runs are
		last = last.Truncate(time.Minute)
		now = last.Add(time.Duration(r.IntN(180)) * time.Minute)
	default:
		now = last.Add(time.Duration(r.Int64N(int64(40 * 24 * time.Hour))))
	}
	return last.Truncate(time.Microsecond), now.Truncate(time.Microsecond)
}

// report prints a count line, and appends it to $CELERIAC_BEAT_ORACLE_LOG
// when set (.ci/test prints that file: go test shows no output of passing
// packages).
func report(t *testing.T, format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	fmt.Print(line)
	if path := os.Getenv("CELERIAC_BEAT_ORACLE_LOG"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOracle checks the crontab and interval schedules against Python
// Celery's own, in one Python process per Celery version: for each random
// spec, zone and pair of instants, remaining_estimate and is_due must be
// equal to the microsecond, and a spec Celery refuses must be refused.
func TestOracle(t *testing.T) {
	for _, v := range []struct {
		version string
		d       Dialect
	}{{"5.2", Celery52}, {"5.5", Celery55}, {"5.6", Celery56}} {
		t.Run(v.version, func(t *testing.T) {
			r := rand.New(rand.NewPCG(42, uint64(v.d)))
			locs := map[string]*time.Location{}
			trans := map[string][]time.Time{}
			for _, z := range oracleZones {
				loc, err := time.LoadLocation(z)
				if err != nil {
					t.Fatal(err)
				}
				locs[z], trans[z] = loc, transitions(loc)
			}
			g := cronGen{r: r, months: v.d != Celery52}
			var cases []oracleCase
			nCron := *oracleCases
			for i := range nCron + nCron/4 {
				z := oracleZones[r.IntN(len(oracleZones))]
				last, now := instants(r, trans[z])
				c := oracleCase{TZ: z, Last: last.UnixMicro(), Now: now.UnixMicro()}
				if i < nCron {
					c.Kind, c.Spec = "cron", g.spec()
					if v.d != Celery52 && r.IntN(5) == 0 {
						d := float64(r.IntN(7200))
						c.Deadline = &d
					}
				} else {
					c.Kind = "interval"
					c.Every = []int64{1, 10, 60, 90, 3600, 5400, 86400, 90000}[r.IntN(8)] * 1e6
					if r.IntN(4) == 0 {
						c.Every = r.Int64N(3 * 86400e6)
					}
					c.Relative = r.IntN(2) == 0
				}
				cases = append(cases, c)
			}
			answers := askOracle(t, v.version, cases)
			equal, cron, cronEqual, refused := 0, 0, 0, 0
			var diffs []string
			for i, c := range cases {
				got := goAnswer(c, locs[c.TZ], v.d)
				want := answers[i]
				same := (got.Err != "") == (want.Err != "")
				if same && got.Err == "" {
					same = got.Rem == want.Rem && got.Due == want.Due && math.Round(want.Next*1e6) == math.Round(got.Next*1e6)
				}
				if c.Kind == "cron" {
					cron++
					if same {
						cronEqual++
					}
					if want.Err != "" {
						refused++
					}
				}
				if same {
					equal++
				} else if len(diffs) < 20 {
					diffs = append(diffs, fmt.Sprintf("%+v\n\tlast %s now %s\n\tgo     %+v\n\tpython %+v", c,
						time.UnixMicro(c.Last).In(locs[c.TZ]), time.UnixMicro(c.Now).In(locs[c.TZ]), got, want))
				}
			}
			report(t, "BEAT ORACLE: Celery %s: %d cases, %d equal (crontab %d cases, %d equal, %d refused by both; intervals %d)\n",
				v.version, len(cases), equal, cron, cronEqual, refused, len(cases)-cron)
			if equal != len(cases) {
				t.Errorf("%d of %d cases differ from Celery %s; the first:\n%s", len(cases)-equal, len(cases), v.version, strings.Join(diffs, "\n"))
			}
		})
	}
}

// goAnswer is what the beat package says for a case.
func goAnswer(c oracleCase, loc *time.Location, d Dialect) oracleAnswer {
	z := Zone{Location: loc, Dialect: d}
	var s Schedule
	switch c.Kind {
	case "cron":
		ct, err := NewCrontab(CronSpec{Minute: c.Spec[0], Hour: c.Spec[1], DayOfWeek: c.Spec[2], DayOfMonth: c.Spec[3], MonthOfYear: c.Spec[4]}, z)
		if err != nil {
			return oracleAnswer{Err: err.Error()}
		}
		if c.Deadline != nil {
			ct.StartingDeadline = time.Duration(*c.Deadline * float64(time.Second))
		}
		s = ct
	case "interval":
		s = &Interval{Every: time.Duration(c.Every) * time.Microsecond, Relative: c.Relative, Zone: z}
	}
	last, now := time.UnixMicro(c.Last), time.UnixMicro(c.Now)
	rem, err := s.Remaining(last, now)
	if err != nil {
		return oracleAnswer{Err: err.Error()}
	}
	due, next, err := s.IsDue(last, now)
	if err != nil {
		return oracleAnswer{Err: err.Error()}
	}
	return oracleAnswer{Rem: rem.Microseconds(), Due: due, Next: next.Seconds()}
}

// solarTolerance is how far Solar's event times may be from PyEphem's:
// Solar's sun position is good to about 0.01°, a few seconds of time
// where the sun crosses the horizon steeply, more where it grazes it.
const solarTolerance = 30 * time.Second

// grazingTolerance is the tolerance where the sun's highest or lowest
// altitude that day is within 1° of the event's horizon.
const grazingTolerance = 5 * time.Minute

// grazing is how far (degrees) the sun's highest or lowest altitude on the
// day of t is from the event's horizon: near zero, PyEphem and Solar may
// disagree on whether it crosses at all (the declination moves up to
// 0.4° a day, and PyEphem reads it up to a day later).
func grazing(s *Solar, t time.Time) float64 {
	_, dec, radius, _ := sun(days(t), s.Lon)
	h := s.horizon
	if !s.useCenter {
		h -= radius
	}
	lat := s.Lat * math.Pi / 180
	highest := math.Pi/2 - math.Abs(lat-dec)
	lowest := math.Abs(lat+dec) - math.Pi/2
	return min(math.Abs(highest-h), math.Abs(lowest-h)) * 180 / math.Pi
}

// TestSolarOracle checks solar schedules against Celery's (PyEphem) for
// random events, places (polar ones included, where the fallback to the
// next antitransit applies) and instants.
func TestSolarOracle(t *testing.T) {
	for _, v := range []struct {
		version string
		d       Dialect
	}{{"5.2", Celery52}, {"5.6", Celery56}} {
		t.Run(v.version, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, 7))
			events := []string{"dawn_astronomical", "dawn_nautical", "dawn_civil", "sunrise", "solar_noon",
				"sunset", "dusk_civil", "dusk_nautical", "dusk_astronomical"}
			var cases []oracleCase
			for range 3000 {
				lat := r.Float64()*120 - 60
				if r.IntN(10) == 0 {
					lat = r.Float64()*178 - 89
				}
				last := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(r.Int64N(int64(10 * 365 * 24 * time.Hour)))).Truncate(time.Microsecond)
				now := last.Add(time.Duration(r.Int64N(int64(48 * time.Hour))))
				cases = append(cases, oracleCase{Kind: "solar", Event: events[r.IntN(len(events))],
					Lat: math.Round(lat*1e4) / 1e4, Lon: math.Round((r.Float64()*360-180)*1e4) / 1e4,
					TZ: "UTC", Last: last.UnixMicro(), Now: now.UnixMicro()})
			}
			answers := askOracle(t, v.version, cases)
			within, fallback, celeryFails, grazes := 0, 0, 0, 0
			var worst time.Duration
			var diffs []string
			for i, c := range cases {
				s, err := NewSolar(c.Event, c.Lat, c.Lon, Zone{Dialect: v.d})
				if err != nil {
					t.Fatal(err)
				}
				want := answers[i]
				_, rises := s.riseSet(time.UnixMicro(c.Last))
				if !rises && s.method != transitEvent {
					fallback++
				}
				if want.Err != "" {
					// Celery's fallback where the sun does not cross the horizon
					// adds a timedelta to an ephem.Date and raises TypeError
					// (celery/celery#9514); Solar takes the fallback it meant.
					if !strings.Contains(want.Err, "TypeError") {
						t.Errorf("%+v: Celery: %s", c, want.Err)
					}
					if rises { // PyEphem says the sun does not cross: it must graze
						if g := grazing(s, time.UnixMicro(c.Last)); g > 1 {
							t.Errorf("%+v: Celery finds no crossing, Solar does, %.3f° from grazing", c, g)
						}
						grazes++
					}
					celeryFails++
					within++
					continue
				}
				rem, _ := s.Remaining(time.UnixMicro(c.Last), time.UnixMicro(c.Now))
				d := (rem - time.Duration(want.Rem)*time.Microsecond).Abs()
				worst = max(worst, d)
				// Where the sun barely reaches the horizon, the crossing
				// time is ill-conditioned: minutes per hundredth of a degree.
				if d > solarTolerance && d <= grazingTolerance && grazing(s, time.UnixMicro(c.Last)) < 1 {
					grazes++
					within++
				} else if d <= solarTolerance {
					within++
				} else if len(diffs) < 10 {
					diffs = append(diffs, fmt.Sprintf("%+v: go %v, python %v", c, rem, time.Duration(want.Rem)*time.Microsecond))
				}
			}
			report(t, "BEAT ORACLE: solar: %d cases, %d within %v of Celery %s + PyEphem (largest difference %v; %d where the sun does not cross, Celery raises TypeError in %d, celery/celery#9514; %d grazing, within 5m)\n",
				len(cases), within, solarTolerance, v.version, worst, fallback, celeryFails, grazes)
			if within != len(cases) {
				t.Errorf("%d of %d solar cases beyond %v:\n%s", len(cases)-within, len(cases), solarTolerance, strings.Join(diffs, "\n"))
			}
		})
	}
}
