"""TEST DOUBLE of Amazon S3 for the store's tests: moto's S3 emulation served on loopback only.

Requests are handled one at a time. Real S3 makes a conditional write (If-Match / If-None-Match, which
icechunk uses to move a branch) atomic; moto checks the condition and then writes in two steps, which
concurrent request threads could interleave. Serializing requests gives the emulation S3's atomicity, so a
lost commit in these tests is the store's fault, never the test server's.

    python -m tests.s3_server [--port N]     # prints "port N" once listening, serves until killed
"""

from __future__ import annotations

import argparse
import os
import sys
import threading


def make_app():
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    app = DomainDispatcherApplication(create_backend_app)
    one_at_a_time = threading.Lock()

    def serialized(environ, start_response):
        with one_at_a_time:
            return list(app(environ, start_response))  # the whole body is produced under the lock

    return serialized


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args(argv)
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", args.port, make_app(), threaded=True, request_handler=MotoRequestHandler)
    print(f"port {server.server_address[1]}", flush=True)
    quiet = os.open(os.devnull, os.O_WRONLY)  # nobody reads our output after the port line: never block on it
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
