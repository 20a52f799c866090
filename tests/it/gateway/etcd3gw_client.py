"""Drives etcd3gw (OpenStack tooz's etcd gateway client, from PyPI) against
the server at HOST:PORT given on the command line, through its public API
only. Prints one line per step; any failed expectation raises, so the
process exits non-zero and tests/it/gateway.rs shows the traceback."""

import sys
import threading
import time

from etcd3gw.client import Etcd3Client


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    # api_path=None: discovered from /version, as tooz does.
    client = Etcd3Client(host=host, port=port, api_path=None, timeout=10)
    print("api_path", client.api_path)
    assert client.api_path == "/v3/", client.api_path

    status = client.status()
    assert "version" in status and "header" in status, status
    members = client.members()
    assert len(members) == 1 and members[0]["clientURLs"], members
    print("status+members ok")

    assert client.put("gw/a", "1")
    assert client.put("gw/b", b"\x00\xffbinary")
    assert client.get("gw/a") == [b"1"], client.get("gw/a")
    assert client.get("gw/b") == [b"\x00\xffbinary"]
    assert client.get("gw/missing") == []
    prefix = client.get_prefix("gw/")
    assert [meta["key"] for _, meta in prefix] == [b"gw/a", b"gw/b"], prefix
    print("put/get ok")

    assert client.create("gw/c", "new")
    assert not client.create("gw/c", "again")
    assert client.replace("gw/c", "new", "newer")
    assert not client.replace("gw/c", "new", "newest")
    assert client.get("gw/c") == [b"newer"]
    assert client.delete("gw/c")
    assert not client.delete("gw/c")
    print("create/replace/delete ok")

    lease = client.lease(ttl=30)
    assert lease.id > 0
    assert client.put("gw/leased", "x", lease=lease)
    assert 0 < lease.ttl() <= 30
    assert lease.refresh() == 30, "keepalive answers the granted TTL"
    assert lease.keys() == [b"gw/leased"], lease.keys()
    assert lease.revoke()
    assert client.get("gw/leased") == []
    print("lease ok")

    lock = client.lock(id="gw-lock", ttl=30)
    assert lock.acquire()
    assert lock.is_acquired()
    other = client.lock(id="gw-lock", ttl=30)
    # etcd3gw's lock is a create-if-absent transaction on its key; a
    # second holder gives up after the lock's timeout, so only look.
    assert lock.release()
    assert not lock.is_acquired()
    assert other.acquire()
    assert other.release()
    print("lock ok")

    events, cancel = client.watch_prefix("gw/w/")
    seen = []

    def collect() -> None:
        for event in events:
            seen.append(event)
            if len(seen) == 2:
                break

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    time.sleep(0.5)
    client.put("gw/w/1", "one")
    client.delete("gw/w/1")
    reader.join(timeout=10)
    cancel()
    assert len(seen) == 2, seen
    assert seen[0]["kv"]["key"] == b"gw/w/1" and seen[0]["kv"]["value"] == b"one", seen
    assert seen[1].get("type") == "DELETE", seen
    print("watch ok")

    assert client.delete_prefix("gw/")
    assert client.get_prefix("gw/") == []
    print("etcd3gw: all ok")


if __name__ == "__main__":
    main()
