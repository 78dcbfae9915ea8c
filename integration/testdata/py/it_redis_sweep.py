"""Run kombu's own restore sweep (QoS.restore_visible) once: the Python side
of the visibility renewal test."""
from it_redis_app import app

with app.connection_for_write() as conn:
    conn.default_channel.qos.restore_visible(num=None, interval=1)
print("swept")
