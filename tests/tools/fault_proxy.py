#!/usr/bin/env python3
"""A fault-injecting TCP proxy for the transport tests (loopback only).

Forwards each client connection to --upstream, applying one action per connection, taken in order
from --actions (comma-separated; `ACTIONxK` repeats an action K times); once the list is used up,
connections pass through untouched. Bytes are counted on the server-to-client direction.

  pass            forward unchanged
  drop:N          close the client connection (FIN) after N bytes; drop:A-B picks N in [A, B]
  reset:N         same, but abort with a TCP reset (RST); reset:A-B likewise
  stall:N         after N bytes forward nothing more, keep the connection open until the client leaves
  503, 429        answer `HTTP/1.1 503 Service Unavailable` (or 429 Too Many Requests), Retry-After: 0,
                  without contacting upstream
  refuse          close the connection at once, before any byte
  delay:MS        hold the server's first bytes back for MS milliseconds, then forward everything (a
                  server slow to start its answer)

Example: --actions "drop:1000-5000000x20" drops the first 20 connections at random offsets.
--rate B caps every connection at B bytes per second (server to client), as a per-connection
bandwidth limit of a remote store would (the scale-out benchmark uses it).
Random offsets come from --seed. Every connection appends one line to --log:
`<n> <action> <bytes forwarded> <outcome>`, where outcome is `faulted` when the fault fired.
The listening port is written to --port-file once the proxy accepts connections.
"""

import argparse
import asyncio
import os
import random
import socket
import struct
import sys


def parse_actions(text, rng):
    actions = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        count = 1
        if "x" in item and item.rsplit("x", 1)[1].isdigit():
            item, n = item.rsplit("x", 1)
            count = int(n)
        kind, _, arg = item.partition(":")
        if kind not in ("pass", "drop", "reset", "stall", "503", "429", "refuse", "delay"):
            raise SystemExit(f"fault_proxy: unknown action {kind!r}")
        for _ in range(count):
            limit = None
            if arg:
                lo, _, hi = arg.partition("-")
                limit = rng.randint(int(lo), int(hi)) if hi else int(lo)
            actions.append((kind, limit))
    return actions


class Proxy:
    def __init__(self, upstream, actions, log_path, rate=0):
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.actions = actions
        self.log_path = log_path
        self.rate = rate  # bytes per second per connection, server to client; 0 = no cap
        self.count = 0

    def log(self, n, action, sent, outcome):
        if self.log_path:
            with open(self.log_path, "a") as f:
                f.write(f"{n} {action[0]}:{action[1]} {sent} {outcome}\n")

    async def handle(self, reader, writer):
        n = self.count
        self.count += 1
        action = self.actions[n] if n < len(self.actions) else ("pass", None)
        kind, limit = action
        if kind == "refuse":
            self.log(n, action, 0, "faulted")
            abort(writer)
            return
        if kind in ("503", "429"):
            self.log(n, action, 0, "faulted")  # before answering, so a client never outruns the log
            try:
                await reader.read(65536)
                body = f"{kind} injected by fault_proxy\n".encode()
                reason = "Service Unavailable" if kind == "503" else "Too Many Requests"
                writer.write(
                    f"HTTP/1.1 {kind} {reason}\r\nRetry-After: 0\r\nConnection: close\r\n".encode()
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
            except OSError:
                pass
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.log(n, action, 0, "upstream-unreachable")
            abort(writer)
            return
        state = {"sent": 0, "faulted": False}
        up = asyncio.ensure_future(pipe(reader, up_writer))
        down = asyncio.ensure_future(self.downstream(up_reader, writer, kind, limit, state))
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        if state["faulted"] and kind == "stall":
            await up  # hold the connection until the client gives up
        for t in (up, down):
            t.cancel()
        for w in (writer, up_writer):
            if not w.is_closing():
                w.close()
        self.log(n, action, state["sent"], "faulted" if state["faulted"] else "completed")

    async def downstream(self, up_reader, writer, kind, limit, state):
        loop = asyncio.get_running_loop()
        start = loop.time()
        piece = 256 * 1024 if not self.rate else max(4096, min(256 * 1024, self.rate // 50))
        while True:
            if self.rate:  # pace this connection: never ahead of rate x elapsed
                ahead = state["sent"] / self.rate - (loop.time() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            data = await up_reader.read(piece)
            if kind == "delay" and limit and state["sent"] == 0 and not state["faulted"]:
                state["faulted"] = True
                await asyncio.sleep(limit / 1000)
            if not data:
                writer.write_eof() if writer.can_write_eof() else None
                return
            if kind in ("drop", "reset", "stall") and limit is not None:
                room = limit - state["sent"]
                if len(data) >= room:
                    if room > 0:
                        writer.write(data[:room])
                        await writer.drain()
                        state["sent"] += room
                    state["faulted"] = True
                    if kind == "reset":
                        abort(writer)
                    elif kind == "drop":
                        writer.close()
                    else:
                        await asyncio.Event().wait()  # stall forever (cancelled by the client leaving)
                    return
            writer.write(data)
            await writer.drain()
            state["sent"] += len(data)


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(256 * 1024)
            if not data:
                return
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.CancelledError):
        return


def abort(writer):
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--actions", default="", help="per-connection actions, see above")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0 = any free one)")
    ap.add_argument("--port-file", help="where to write the listening port")
    ap.add_argument("--log", help="append one line per connection here")
    ap.add_argument("--rate", type=int, default=0, help="cap each connection at this many bytes/s (0: none)")
    args = ap.parse_args()
    proxy = Proxy(args.upstream, parse_actions(args.actions, random.Random(args.seed)), args.log, args.rate)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", args.port)
    port = server.sockets[0].getsockname()[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    else:
        print(port, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
