package beat

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Solar is Celery's solar(event, lat, lon) schedule: the next sunrise,
// sunset, dawn, dusk or solar noon after the last run, seen from a point
// on the Earth. Celery asks PyEphem; Solar follows PyEphem's search (hour
// angles, the same horizons, no refraction) with a sun position of about
// 0.01° accuracy (Meeus, Astronomical Algorithms ch. 25), so its times
// differ from Celery's by seconds (TestSolarOracle states the tolerance).
type Solar struct {
	Event    string
	Lat, Lon float64
	Zone     Zone

	horizon   float64 // radians
	useCenter bool
	method    int // riseEvent, setEvent, transitEvent
}

const (
	riseEvent = iota
	setEvent
	transitEvent
)

// Celery's table of events: horizon (degrees), PyEphem method, and
// whether the sun's centre (not its upper limb) is what crosses it.
// dusk_astronomical's horizon is +18°, not -18°, before Celery 5.6
// (celery/celery#10101): kept as the dialect says.
var solarEvents = map[string]struct {
	horizon   float64
	method    int
	useCenter bool
}{
	"dawn_astronomical": {-18, riseEvent, true},
	"dawn_nautical":     {-12, riseEvent, true},
	"dawn_civil":        {-6, riseEvent, true},
	"sunrise":           {-34.0 / 60, riseEvent, false},
	"solar_noon":        {0, transitEvent, false},
	"sunset":            {-34.0 / 60, setEvent, false},
	"dusk_civil":        {-6, setEvent, true},
	"dusk_nautical":     {-12, setEvent, true},
	"dusk_astronomical": {18, setEvent, true},
}

// NewSolar checks the event and coordinates as Celery does.
func NewSolar(event string, lat, lon float64, z Zone) (*Solar, error) {
	ev, ok := solarEvents[event]
	if !ok {
		names := make([]string, 0, len(solarEvents))
		for n := range solarEvents {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("argument event %q is invalid, must be one of %s", event, strings.Join(names, ", "))
	}
	if math.IsNaN(lat) || lat < -90 || lat > 90 {
		return nil, fmt.Errorf("argument latitude %v is invalid, must be between -90 and 90", lat)
	}
	if math.IsNaN(lon) || lon < -180 || lon > 180 {
		return nil, fmt.Errorf("argument longitude %v is invalid, must be between -180 and 180", lon)
	}
	if event == "dusk_astronomical" && z.Dialect == Celery56 {
		ev.horizon = -18
	}
	return &Solar{Event: event, Lat: lat, Lon: lon, Zone: z, horizon: ev.horizon * math.Pi / 180,
		useCenter: ev.useCenter, method: ev.method}, nil
}

func (s *Solar) String() string {
	return fmt.Sprintf("<solar: %s at latitude %v, longitude: %v>", s.Event, s.Lat, s.Lon)
}

// Next is the first event after t; where the sun does not cross the
// horizon that day, Celery's fallback: a minute after the next
// antitransit (solar midnight).
func (s *Solar) Next(t time.Time) time.Time {
	if s.method == transitEvent {
		return s.transit(t, 0)
	}
	if next, ok := s.riseSet(t); ok {
		return next
	}
	return s.transit(t, math.Pi).Add(time.Minute)
}

// Remaining is solar.remaining_estimate.
func (s *Solar) Remaining(lastRun, now time.Time) (time.Duration, error) {
	next := s.Next(lastRun).Truncate(time.Microsecond)
	return next.Sub(now), nil
}

// IsDue is solar.is_due.
func (s *Solar) IsDue(lastRun, now time.Time) (bool, time.Duration, error) {
	rem, _ := s.Remaining(lastRun, now)
	if rem > 0 {
		return false, rem, nil
	}
	rem, _ = s.Remaining(now, now)
	return true, max(rem, 0), nil
}

const tau = 2 * math.Pi

// days is a time as days since J2000.0 (UT).
func days(t time.Time) float64 {
	return float64(t.Sub(j2000)) / float64(24*time.Hour)
}

var j2000 = time.Date(2000, 1, 1, 12, 0, 0, 0, time.UTC)

func fromDays(d float64) time.Time {
	return j2000.Add(time.Duration(d * float64(24*time.Hour)))
}

// sun is the sun's apparent right ascension, declination (radians),
// angular radius (radians) and the local hour angle at lon (degrees east),
// d days after J2000.0 UT.
func sun(d, lon float64) (ra, dec, radius, ha float64) {
	const deg = math.Pi / 180
	T := (d + 69.0/86400) / 36525 // TT, with ΔT about 69 s
	L0 := 280.46646 + 36000.76983*T + 0.0003032*T*T
	M := (357.52911 + 35999.05029*T - 0.0001537*T*T) * deg
	e := 0.016708634 - 0.000042037*T - 0.0000001267*T*T
	C := (1.914602-0.004817*T-0.000014*T*T)*math.Sin(M) + (0.019993-0.000101*T)*math.Sin(2*M) + 0.000289*math.Sin(3*M)
	trueLon := L0 + C
	nu := M + C*deg
	R := 1.000001018 * (1 - e*e) / (1 + e*math.Cos(nu))
	omega := (125.04 - 1934.136*T) * deg
	lambda := (trueLon - 0.00569 - 0.00478*math.Sin(omega)) * deg
	eps0 := 23 + (26+(21.448-T*(46.8150+T*(0.00059-T*0.001813)))/60)/60
	eps := (eps0 + 0.00256*math.Cos(omega)) * deg
	ra = math.Atan2(math.Cos(eps)*math.Sin(lambda), math.Cos(lambda))
	dec = math.Asin(math.Sin(eps) * math.Sin(lambda))
	radius = 959.63 / 3600 * deg / R
	Tu := d / 36525
	gmst := 280.46061837 + 360.98564736629*d + 0.000387933*Tu*Tu - Tu*Tu*Tu/38710000
	// Apparent sidereal time: the equation of the equinoxes.
	L := (280.4665 + 36000.7698*T) * deg
	dpsi := -17.20*math.Sin(omega) - 1.32*math.Sin(2*L)
	gast := gmst + dpsi/3600*math.Cos(eps)
	ha = math.Mod((gast+lon)*deg-ra, tau)
	if ha < 0 {
		ha += tau
	}
	return ra, dec, radius, ha
}

// riseSet is PyEphem's _find_rise_or_set for the next rising or setting:
// step to the hour angle at which the sun is at the horizon until the step
// is under a tenth of a second; ok is false where the sun stays above or
// below it (CircumpolarError).
func (s *Solar) riseSet(t time.Time) (time.Time, bool) {
	const precision = 1.0 / 86400 / 10
	lat := s.Lat * math.Pi / 180
	d := days(t)
	first := true
	var absTarget float64
	for range 1000 {
		_, dec, radius, ha := sun(d, s.Lon)
		horizon := s.horizon
		if !s.useCenter {
			horizon -= radius
		}
		arg := (math.Sin(horizon) - math.Sin(lat)*math.Sin(dec)) / (math.Cos(lat) * math.Cos(dec))
		switch {
		case arg < -1:
			absTarget = math.Pi + 1e-15
		case arg > 1:
			absTarget = -1e-15
		default:
			absTarget = math.Acos(arg)
		}
		target := absTarget
		if s.method == riseEvent {
			target = -absTarget
		}
		// PyEphem's ha is in (-pi, pi].
		if ha > math.Pi {
			ha -= tau
		}
		diff := target - ha
		var bump float64
		if first {
			diff = math.Mod(diff, tau)
			if diff < 0 {
				diff += tau
			}
			bump = diff / tau
			if math.Abs(bump) < precision {
				bump++
			}
			first = false
		} else {
			diff = math.Mod(diff-math.Pi, tau)
			if diff < 0 {
				diff += tau
			}
			bump = (diff - math.Pi) / tau
		}
		if math.Abs(bump) < precision {
			break
		}
		d += bump
	}
	if absTarget > math.Pi || absTarget < 0 {
		return time.Time{}, false
	}
	return fromDays(d), true
}

// transit is the next time after t the sun's hour angle is offset (0: the
// meridian, solar noon; pi: the antimeridian), by Newton's method from
// PyEphem's first guess.
func (s *Solar) transit(t time.Time, offset float64) time.Time {
	f := func(d float64) float64 {
		_, _, _, ha := sun(d, s.Lon)
		x := math.Mod(offset-ha, tau)
		if x > math.Pi {
			x -= tau
		} else if x < -math.Pi {
			x += tau
		}
		return x
	}
	d0 := days(t)
	_, _, _, ha := sun(d0, s.Lon)
	move := math.Mod(offset-ha, tau)
	if move < 0 {
		move += tau
	}
	if math.Abs(move) < (math.Pi/180/3600)/360 {
		move = tau
	}
	d := d0 + move/tau
	// Secant steps, as PyEphem's newton().
	x0, x1 := d, d+1.0/1440
	f0, f1 := f(x0), f(x1)
	for range 100 {
		if math.Abs(x1-x0) < 1.0/86400/10 || f1 == f0 {
			break
		}
		x0, x1 = x1, x1-f1*(x1-x0)/(f1-f0)
		f0, f1 = f1, f(x1)
	}
	return fromDays(x1)
}
