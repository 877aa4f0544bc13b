"""tests/server/srv_util.py - helpers shared by the Python server tests."""
import re
import select
import time

_SERVING = re.compile(r"serving on http://[^:]+:(\d+)")


def wait_serving_port(stream, timeout_s=60.0):
    """Read lines of a server's stdout until `serving on http://HOST:PORT`; the port, or None when the
    stream ends or timeout_s passes first."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        r, _, _ = select.select([stream], [], [], 1.0)
        if not r:
            continue
        line = stream.readline()
        if not line:
            return None
        m = _SERVING.search(line)
        if m:
            return int(m.group(1))
    return None
