"""Who-am-I servers for the sandbox (stdlib only; forked into a namespace by the fork server).

Usage: servers.py NAME PORT [PORT ...] [--http PORT ...] [--echo PORT ...]
       servers.py --fork-server FD

Listens on every given port for TCP and UDP, IPv4 and IPv6, on all addresses, and answers each
connection or datagram with one line "NAME LOCAL_IP:PORT PEER_IP" (IPv6 as "[ip]:port"); the
--http ports (TCP only) answer an HTTP request with that line as the body; the --echo ports
(TCP only) keep each connection open and answer every chunk received with "NAME " and the
chunk, for tests of long-lived connections. The
local address is the one the packet arrived for after any DNAT and the peer is the source after
any SNAT, so a reply shows both which endpoint answered and whether the client was masqueraded.

Prints "ready" once every socket is bound, and exits when stdin reaches EOF, so it never
outlives the test process that started it.

With --fork-server, it starts such servers for the testbed instead: each request on the Unix
socket FD names a namespace and a server's arguments and carries its stdin, stdout and stderr;
a forked child enters the namespace and serves. A fork costs nothing next to an interpreter's
start (about a second under the IPVS VM's emulation, five per testbed).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import selectors
import signal
import socket
import struct
import sys
import traceback

IP_PKTINFO = 8  # not exported by Python 3.11's socket module
IN_PKTINFO = struct.Struct("=i4s4s")  # ifindex, spec_dst, addr
IN6_PKTINFO = struct.Struct("=16si")  # addr, ifindex
CLONE_NEWNET = 0x40000000


def reply_line(name: str, local_ip: str, local_port: int, peer_ip: str) -> bytes:
    """Format the answer; IPv6 hosts are bracketed so the port split is unambiguous."""
    host = f"[{local_ip}]" if ":" in local_ip else local_ip
    return f"{name} {host}:{local_port} {peer_ip}\n".encode()


def bind(family: int, kind: int, port: int) -> socket.socket:
    """One wildcard socket; IPv6 sockets are v6-only so IPv4 peers never appear as ::ffff:x."""
    sock = socket.socket(family, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    if kind == socket.SOCK_DGRAM:
        # Needed to learn (and answer from) the address each datagram was sent to.
        if family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    if kind == socket.SOCK_STREAM:
        sock.listen(socket.SOMAXCONN)
    sock.setblocking(False)
    return sock


def answer_tcp(name: str, listener: socket.socket) -> None:
    """Accept one connection, send the line and close (the server closes first)."""
    conn, peer = listener.accept()
    with conn:
        local = conn.getsockname()
        conn.sendall(reply_line(name, local[0], local[1], peer[0]))


def answer_http(name: str, listener: socket.socket) -> None:
    """Accept one HTTP request (for curl and browsers) and answer with the line as the body."""
    conn, peer = listener.accept()
    with conn:
        conn.settimeout(2.0)
        local = conn.getsockname()
        request = b""
        try:
            while b"\r\n\r\n" not in request and len(request) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                request += chunk
        except OSError:
            return
        body = reply_line(name, local[0], local[1], peer[0])
        head = f"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        conn.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)


def accept_echo(sel: selectors.BaseSelector, name: str, listener: socket.socket) -> None:
    """Accept a long-lived connection; it is answered chunk by chunk until the peer closes."""
    conn, _ = listener.accept()
    conn.setblocking(False)
    sel.register(conn, selectors.EVENT_READ, functools.partial(answer_echo, sel))


def answer_echo(sel: selectors.BaseSelector, name: str, conn: socket.socket) -> None:
    try:
        data = conn.recv(4096)
    except ConnectionError:
        data = b""
    if data:
        conn.sendall(name.encode() + b" " + data)  # a few bytes: the buffer takes them
    else:
        sel.unregister(conn)
        conn.close()


def answer_udp(name: str, sock: socket.socket) -> None:
    """Answer one datagram from the address it was sent to, so connected clients accept it."""
    port = sock.getsockname()[1]
    _, ancdata, _, peer = sock.recvmsg(2048, socket.CMSG_SPACE(IN6_PKTINFO.size))
    for level, kind, data in ancdata:
        if (level, kind) == (socket.IPPROTO_IP, IP_PKTINFO):
            _, _, addr = IN_PKTINFO.unpack(data[: IN_PKTINFO.size])
            local = socket.inet_ntop(socket.AF_INET, addr)
            cmsg = (level, kind, IN_PKTINFO.pack(0, addr, bytes(4)))
            break
        if (level, kind) == (socket.IPPROTO_IPV6, socket.IPV6_PKTINFO):
            addr, _ = IN6_PKTINFO.unpack(data[: IN6_PKTINFO.size])
            local = socket.inet_ntop(socket.AF_INET6, addr)
            cmsg = (level, kind, IN6_PKTINFO.pack(addr, 0))
            break
    else:
        return
    sock.sendmsg([reply_line(name, local, port, peer[0])], [cmsg], 0, peer)


def main(argv: list[str]) -> int:
    """Bind everything, report readiness, serve until stdin closes."""
    name = argv[0]
    groups: dict[str, list[int]] = {"": [], "--http": [], "--echo": []}
    group = groups[""]
    for arg in argv[1:]:
        if arg in groups:
            group = groups[arg]
        else:
            group.append(int(arg))
    sel = selectors.DefaultSelector()
    echo = functools.partial(accept_echo, sel)
    for family in (socket.AF_INET, socket.AF_INET6):
        for port in groups[""]:
            sel.register(bind(family, socket.SOCK_STREAM, port), selectors.EVENT_READ, answer_tcp)
            sel.register(bind(family, socket.SOCK_DGRAM, port), selectors.EVENT_READ, answer_udp)
        for port in groups["--http"]:
            sel.register(bind(family, socket.SOCK_STREAM, port), selectors.EVENT_READ, answer_http)
        for port in groups["--echo"]:
            sel.register(bind(family, socket.SOCK_STREAM, port), selectors.EVENT_READ, echo)
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, None)
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                if not os.read(key.fd, 4096):
                    return 0
                continue
            try:
                key.data(name, key.fileobj)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:  # e.g. EPERM when a test's nft rule drops our reply
                print(f"{name}: {exc}", file=sys.stderr, flush=True)


def enter_netns(name: str) -> None:
    """Move this (single-threaded) process into the named network namespace."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns(/run/netns/{name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def fork_server(control: socket.socket) -> int:
    """Start a server per request: [namespace, argv] as JSON with three descriptors (its
    stdin, stdout, stderr); answers the child's pid. Exits when the control socket closes.
    Children are reaped by the kernel (SIGCHLD ignored): the testbed watches them by pidfd."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        message, fds, _, _ = socket.recv_fds(control, 65536, 3)
        if not message:
            return 0
        netns, argv = json.loads(message)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                enter_netns(netns)
                code = main(argv)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        for fd in fds:
            os.close(fd)
        control.sendall(f"{pid}\n".encode())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fork-server"]:
        sys.exit(fork_server(socket.socket(fileno=int(sys.argv[2]))))
    sys.exit(main(sys.argv[1:]))
