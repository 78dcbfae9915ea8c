// Package beat is celeriac's periodic task scheduler, a replacement for
// `celery beat`: Celery's schedules (intervals, crontab with Celery's
// string syntax, solar events), entries with Celery's fields, and a
// scheduler that publishes each due run as the task message Python beat
// sends.
//
// The schedules reproduce Celery's arithmetic, quirks included, and are
// tested against Python Celery as the oracle (TestOracle): for thousands of
// random crontab specs, time zones with DST changes and instants, the time
// until the next run equals crontab.remaining_estimate and is_due to the
// microsecond, for Celery 5.2 (pytz) and Celery 5.3+ (zoneinfo), whose DST
// handling differs; Dialect picks one.
package beat
