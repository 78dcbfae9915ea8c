"""The Python side of examples/sms: plain Celery code that queues outbound SMS
messages for the celeriac worker's sms.send task, as a Django view would.

    export CELERY_BROKER_URL=redis://127.0.0.1:6379/0
    /usr/bin/python3 examples/sms/producer.py                 # 50 messages
    /usr/bin/python3 examples/sms/producer.py --count 20 --bad 0 --duplicates 5

Each message has a message_id of its own (the worker deduplicates on it);
--bad gives that many of them an invalid number (the provider answers 400,
which is never retried) and --duplicates queues that many of them twice (the
second task must not send again). It prints one JSON line per task,
{"task_id", "message_id", "to"}; with --wait (and CELERY_RESULT_BACKEND) it
waits for the results and prints how they ended.
"""
import argparse
import json
import os
import sys
import uuid

from celery import Celery


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=50, help="messages to send (default 50)")
    p.add_argument("--bad", type=int, default=2, help="of which go to an invalid number (default 2)")
    p.add_argument("--duplicates", type=int, default=0, help="messages queued a second time (default 0)")
    p.add_argument("--queue", default=os.environ.get("SMS_QUEUE", "sms"), help="queue (default sms)")
    p.add_argument("--run", default=uuid.uuid4().hex[:8], help="prefix of the message ids (default: random)")
    p.add_argument("--wait", type=float, default=0, help="seconds to wait for the results (needs CELERY_RESULT_BACKEND)")
    args = p.parse_args()

    app = Celery("producer", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
                 backend=os.environ.get("CELERY_RESULT_BACKEND") or None)
    app.conf.broker_connection_retry_on_startup = True

    messages = []
    for i in range(args.count):
        to = "+1555%07d" % i if i >= args.bad else "555-%04d" % i
        messages.append({"message_id": "%s-%03d" % (args.run, i), "to": to,
                         "body": "Your code is %06d" % (i * 7919 % 1000000)})
    # The last ones: the first --bad are refused, and a refused message is
    # not "done", so its copy would be tried (and refused) again.
    messages += messages[len(messages) - args.duplicates:] if args.duplicates else []

    results = []
    with app.producer_or_acquire() as producer:
        for m in messages:
            r = app.send_task("sms.send", kwargs=m, queue=args.queue, producer=producer)
            results.append(r)
            print(json.dumps({"task_id": r.id, "message_id": m["message_id"], "to": m["to"]}), flush=True)

    if args.wait:
        states = {}
        for r in results:
            r.get(timeout=args.wait, propagate=False)
            states[r.state] = states.get(r.state, 0) + 1
        print(json.dumps({"states": states}), flush=True)
    app.close()


if __name__ == "__main__":
    sys.exit(main())
