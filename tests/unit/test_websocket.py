"""Our RFC 6455 WebSocket (``osb_sync/_websocket.py``): RFC 6455's own examples (1.3 and 5.7),
each hostile frame refused before its payload is read, and both ends checked against
wsproto, an implementation of its own (sans-IO: fed the bytes ours writes, and the reverse).

The terminal frames of ``/pty/{id}/ws`` (``_pty.parse_frame``) and the offset arithmetic of a
reattach (``PtyConnection``) are tested here on bytes too.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto import events as ws_events

from osb_sync import _websocket as ws
from osb_sync._answers import BadAnswer
from osb_sync._errors import ConfigurationError
from osb_sync._pty import Output, PtyConnection, parse_frame, shell_command

HELLO_MASKED = bytes([0x81, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58])
MASK = bytes([0x37, 0xFA, 0x21, 0x3D])


def reader(data: bytes) -> Callable[[int], bytes]:
    """A read function over `data` that hands out at most 3 bytes a call (short reads)."""
    view = [data]

    def read(size: int) -> bytes:
        piece, view[0] = view[0][: min(size, 3)], view[0][min(size, 3) :]
        return piece

    return read


# -- RFC 6455's examples -----------------------------------------------------------------------


def test_the_accept_key_of_rfc_6455_section_1_3() -> None:
    assert ws.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_a_single_frame_unmasked_text_message() -> None:
    wire = bytes([0x81, 0x05]) + b"Hello"
    assert ws.encode_frame(ws.OP_TEXT, b"Hello") == wire
    assert ws.read_frame(reader(wire), 100, masked=False) == ws.Frame(True, ws.OP_TEXT, b"Hello")


def test_a_single_frame_masked_text_message() -> None:
    assert ws.encode_frame(ws.OP_TEXT, b"Hello", mask=MASK) == HELLO_MASKED
    frame = ws.read_frame(reader(HELLO_MASKED), 100, masked=True)
    assert frame == ws.Frame(True, ws.OP_TEXT, b"Hello")


def test_a_fragmented_unmasked_text_message() -> None:
    wire = bytes([0x01, 0x03]) + b"Hel" + bytes([0x80, 0x02]) + b"lo"
    read = reader(wire)
    assert ws.read_frame(read, 100, masked=False) == ws.Frame(False, ws.OP_TEXT, b"Hel")
    assert ws.read_frame(read, 100, masked=False) == ws.Frame(True, ws.OP_CONTINUATION, b"lo")


def test_an_unmasked_ping_and_its_masked_pong() -> None:
    ping = bytes([0x89, 0x05]) + b"Hello"
    pong = bytes([0x8A, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58])
    assert ws.read_frame(reader(ping), 100, masked=False) == ws.Frame(True, ws.OP_PING, b"Hello")
    assert ws.encode_frame(ws.OP_PONG, b"Hello", mask=MASK) == pong


def test_256_bytes_and_64_kib_in_a_single_unmasked_frame() -> None:
    small, large = bytes(range(256)), bytes(65536)
    assert ws.encode_frame(ws.OP_BINARY, small)[:4] == bytes([0x82, 0x7E, 0x01, 0x00])
    head = bytes([0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0])
    assert ws.encode_frame(ws.OP_BINARY, large)[:10] == head
    for payload in (small, large):
        wire = ws.encode_frame(ws.OP_BINARY, payload)
        assert ws.read_frame(reader(wire), 1 << 20, masked=False).payload == payload


# -- hostile frames ----------------------------------------------------------------------------


def refused(wire: bytes, masked: bool = False, max_size: int = 1000) -> ws.ProtocolError:
    with pytest.raises(ws.ProtocolError) as caught:
        ws.read_frame(reader(wire), max_size, masked)
    return caught.value


@pytest.mark.parametrize(
    ("wire", "code", "words"),
    [
        (bytes([0xC1, 0x00]), 1002, "RSV"),  # RSV1 without an extension
        (bytes([0x83, 0x00]), 1002, "opcode"),  # reserved data opcode
        (bytes([0x8B, 0x00]), 1002, "opcode"),  # reserved control opcode
        (bytes([0x09, 0x00]), 1002, "control"),  # fragmented ping
        (bytes([0x89, 0x7E, 0x00, 0x7E]) + bytes(126), 1002, "control"),  # 126-byte ping
        (bytes([0x82, 0x7F]) + struct.pack("!Q", 1 << 63), 1002, "top bit"),
        (bytes([0x81, 0x80]) + MASK, 1002, "masked frame from a server"),
    ],
)
def test_a_client_refuses_a_frame_that_breaks_the_rules(wire: bytes, code: int, words: str) -> None:
    exc = refused(wire)
    assert exc.code == code and words in exc.reason


def test_a_server_refuses_an_unmasked_frame() -> None:
    assert "unmasked" in refused(bytes([0x82, 0x01, 0x00]), masked=True).reason


def test_a_length_past_the_cap_is_refused_before_the_payload_is_read() -> None:
    asked: list[int] = []
    wire = bytes([0x82, 0x7F]) + struct.pack("!Q", 1 << 40)
    data = iter([wire[:2], wire[2:]])

    def read_once(size: int) -> bytes:
        asked.append(size)
        return next(data)

    with pytest.raises(ws.ProtocolError) as caught:
        ws.read_frame(read_once, 1 << 20, masked=False)
    assert caught.value.code == 1009
    assert asked == [2, 8]  # the head only: no payload read was even tried


def test_a_connection_that_ends_mid_frame_is_abnormal() -> None:
    with pytest.raises(ws.Closed) as caught:
        ws.read_frame(reader(bytes([0x82, 0x05, 0x01])), 100, masked=False)
    assert caught.value.code == 1006


@pytest.mark.parametrize(
    ("payload", "code"),
    [(b"\x03", 1002), (struct.pack("!H", 1005), 1002), (struct.pack("!H", 999), 1002),
     (struct.pack("!H", 2000), 1002), (struct.pack("!H", 1000) + b"\xff", 1007)],
)  # fmt: skip
def test_a_close_payload_that_may_not_travel_is_refused(payload: bytes, code: int) -> None:
    with pytest.raises(ws.ProtocolError) as caught:
        ws.parse_close(payload)
    assert caught.value.code == code


def test_close_payloads_that_may_travel() -> None:
    assert ws.parse_close(b"") == (1005, "")
    assert ws.parse_close(ws.close_payload(4001, "TAKEN_OVER")) == (4001, "TAKEN_OVER")
    assert len(ws.close_payload(1000, "é" * 200)) <= 125  # cut on a character boundary
    ws.parse_close(ws.close_payload(1000, "é" * 200))


def pair(max_message: int = 1000) -> tuple[ws.WebSocket, socket.socket]:
    """Our client end over a socketpair, and the raw server end."""
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    theirs.settimeout(5)
    return ws.WebSocket(ours, client=True, max_message=max_message), theirs


def received_frames(sock: socket.socket) -> list[ws.Frame]:
    frames = []
    sock.settimeout(0.5)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, OSError):
        pass
    read = reader(data)
    while True:
        try:
            frames.append(ws.read_frame(read, 1 << 20, masked=True))
        except ws.Closed:
            return frames


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([bytes([0x80, 0x01]) + b"x"], 1002),  # a continuation with no message started
        ([bytes([0x01, 0x01]) + b"a", bytes([0x81, 0x01]) + b"b"], 1002),  # new message inside
        ([bytes([0x81, 0x02]) + b"\xc3\x28"], 1007),  # text that is not UTF-8
        ([bytes([0x02, 0x7E, 0x02, 0x00]) + bytes(512), bytes([0x80, 0x7E, 0x02, 0x00])], 1009),
    ],
)
def test_a_message_that_breaks_the_rules_is_closed_with_its_code(
    frames: list[bytes], code: int
) -> None:
    client, server = pair(max_message=1000)
    for frame in frames:
        server.sendall(frame)
    with pytest.raises(ws.ProtocolError) as caught:
        client.recv()
    assert caught.value.code == code
    close = received_frames(server)[-1]
    assert close.opcode == ws.OP_CLOSE and ws.parse_close(close.payload)[0] == code


def test_pings_are_answered_between_fragments_and_a_close_is_echoed() -> None:
    client, server = pair()
    server.sendall(bytes([0x01, 0x03]) + b"Hel" + bytes([0x89, 0x02]) + b"hi")
    server.sendall(bytes([0x80, 0x02]) + b"lo" + bytes([0x88, 0x02]) + struct.pack("!H", 4001))
    assert client.recv() == (ws.OP_TEXT, b"Hello")
    with pytest.raises(ws.Closed) as caught:
        client.recv()
    assert caught.value.code == 4001
    frames = received_frames(server)
    assert [(f.opcode, f.payload) for f in frames] == [
        (ws.OP_PONG, b"hi"),
        (ws.OP_CLOSE, struct.pack("!H", 4001)),
    ]


def test_a_header_that_would_split_the_handshake_is_refused() -> None:
    with pytest.raises(ValueError):
        ws.handshake_request("h", "/", ws.new_key(), {"X-EXECD-ACCESS-TOKEN": "a\r\nEvil: 1"})


def test_an_answer_head_is_read_at_most_max_head_bytes() -> None:
    endless = iter(lambda: b"X-Filler: " + b"a" * 4000 + b"\r\n", None)
    with pytest.raises(ws.ProtocolError):
        ws.read_answer(lambda _: next(endless))


def test_an_upgrade_with_a_wrong_accept_key_is_refused() -> None:
    key = ws.new_key()
    answer = ws.Answer(
        101,
        {"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-accept": "bogus"},
        b"",
    )
    with pytest.raises(ws.ProtocolError):
        ws.check_upgrade(answer, key)


# -- against wsproto ---------------------------------------------------------------------------


def test_our_client_against_a_wsproto_server() -> None:
    server = WSConnection(ConnectionType.SERVER)
    key = ws.new_key()
    server.receive_data(ws.handshake_request("127.0.0.1:1", "/pty/x/ws", key, {"A": "b"}))
    request = next(server.events())
    assert isinstance(request, ws_events.Request) and request.target == "/pty/x/ws"
    answer_bytes = server.send(ws_events.AcceptConnection())
    answer = ws.read_answer(reader(answer_bytes))
    ws.check_upgrade(answer, key)
    # what our client sends, wsproto reads: masked binary, text, a ping, a close
    wire = b"".join(
        ws.encode_frame(op, payload, mask=ws.new_key().encode()[:4])
        for op, payload in ((ws.OP_BINARY, b"\x00ls\n"), (ws.OP_TEXT, b'{"type":"ping"}'))
    )
    server.receive_data(wire)
    got = list(server.events())
    assert isinstance(got[0], ws_events.BytesMessage) and got[0].data == b"\x00ls\n"
    assert isinstance(got[1], ws_events.TextMessage) and got[1].data == '{"type":"ping"}'
    # what wsproto sends, our client reads, in pieces of 3 bytes
    out = server.send(ws_events.BytesMessage(data=b"\x01" + bytes(70000)))
    out += server.send(ws_events.TextMessage(data='{"type":"exit","exit_code":3}\n'))
    out += server.send(ws_events.CloseConnection(code=1000, reason="process exited"))
    ours, theirs = socket.socketpair()
    client = ws.WebSocket(ours, reader(out), client=True, max_message=1 << 20)
    assert client.recv() == (ws.OP_BINARY, b"\x01" + bytes(70000))
    assert client.recv() == (ws.OP_TEXT, b'{"type":"exit","exit_code":3}\n')
    with pytest.raises(ws.Closed) as caught:
        client.recv()
    assert (caught.value.code, caught.value.reason) == (1000, "process exited")
    theirs.settimeout(2)
    server.receive_data(theirs.recv(1000))  # our echoed close
    assert isinstance(next(server.events()), ws_events.CloseConnection)
    ours.close()
    theirs.close()


def test_our_server_end_against_a_wsproto_client() -> None:
    client = WSConnection(ConnectionType.CLIENT)
    request = client.send(ws_events.Request(host="x", target="/pty/x/ws"))
    key = next(
        line.split(b":", 1)[1].strip().decode()
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    )
    assert ws.valid_key(key)
    client.receive_data(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + ws.accept_key(key).encode() + b"\r\n\r\n"
    )
    assert isinstance(next(client.events()), ws_events.AcceptConnection)
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    server = ws.WebSocket(ours, client=False, max_message=1 << 20)
    theirs.sendall(client.send(ws_events.BytesMessage(data=b"\x00" + bytes(200000))))
    theirs.sendall(client.send(ws_events.Ping(payload=b"p")))
    theirs.sendall(client.send(ws_events.TextMessage(data="\u00e9")))
    assert server.recv() == (ws.OP_BINARY, b"\x00" + bytes(200000))
    assert server.recv() == (ws.OP_TEXT, "\u00e9".encode())
    server.send_binary(b"\x01out")
    server.close(4001, "TAKEN_OVER")
    theirs.settimeout(2)
    data = b""
    while len(data) < 3 + 6 + 14:  # the pong, the output, the close
        data += theirs.recv(1000)
    client.receive_data(data)
    got = list(client.events())
    assert isinstance(got[0], ws_events.Pong) and got[0].payload == b"p"
    assert isinstance(got[1], ws_events.BytesMessage) and got[1].data == b"\x01out"
    assert isinstance(got[2], ws_events.CloseConnection) and got[2].code == 4001
    ours.close()
    theirs.close()


# -- the terminal's frames ---------------------------------------------------------------------


def test_terminal_frames_as_execd_sends_them() -> None:
    assert parse_frame(ws.OP_BINARY, b"\x01out") == Output("output", 1, data=b"out")
    assert parse_frame(ws.OP_BINARY, b"\x02err") == Output("output", 2, data=b"err")
    replay = b"\x03" + struct.pack("!Q", 6) + b"tick2\n"
    assert parse_frame(ws.OP_BINARY, replay) == Output("replay", offset=6, data=b"tick2\n")
    exit_frame = parse_frame(ws.OP_TEXT, b'{"type":"exit","exit_code":3}\n')
    assert exit_frame.kind == "exit" and exit_frame.exit_code == 3
    error = parse_frame(ws.OP_TEXT, b'{"type":"error","code":"INVALID_FRAME","error":"x"}\n')
    assert (error.kind, error.code, error.message) == ("error", "INVALID_FRAME", "x")
    assert parse_frame(ws.OP_TEXT, b'{"type":"connected","session_id":"s","mode":"pty"}\n').kind
    assert parse_frame(ws.OP_TEXT, b'{"type":"later"}').kind == "ignored"
    assert parse_frame(ws.OP_BINARY, b"\x09x").kind == "ignored"


@pytest.mark.parametrize(
    "frame",
    [
        (ws.OP_BINARY, b"\x03\x00\x00"),  # a replay without its whole offset
        (ws.OP_BINARY, b"\x03" + b"\xff" * 8),  # an offset out of range
        (ws.OP_TEXT, b"not json"),
        (ws.OP_TEXT, b"[1]"),
        (ws.OP_TEXT, b'{"type":"exit","exit_code":"3"}'),
        (ws.OP_TEXT, b'{"type":"exit","exit_code":true}'),
        (ws.OP_TEXT, b'{"type":"exit","exit_code":99999999999}'),
        (ws.OP_TEXT, b"[" * 5000),
    ],
)
def test_a_terminal_frame_execd_would_not_send_is_refused(frame: tuple[int, bytes]) -> None:
    with pytest.raises(BadAnswer):
        parse_frame(*frame)


class NoExecd:
    secrets = ("tok",)


def test_a_reattach_cuts_a_replay_to_the_offset_and_counts_a_gap() -> None:
    conn = PtyConnection(NoExecd(), "s")  # type: ignore[arg-type]
    halt = threading.Event()
    conn._deliver(Output("output", data=b"tick1\n"), 0, halt)
    assert conn.offset == 6
    conn._deliver(Output("replay", offset=3, data=b"k1\ntick2\n"), 0, halt)  # overlaps: cut
    assert conn.offset == 12
    conn._deliver(Output("replay", offset=20, data=b"late"), 0, halt)  # 8 bytes were lost
    assert (conn.offset, conn.lost) == (24, 8)
    got = [conn._queue.get_nowait()[1] for _ in range(3)]
    assert got == [b"tick1\n", b"tick2\n", b"late"]


def test_a_session_environment_is_exported_quoted() -> None:
    assert shell_command("ls", None) == "ls"
    assert shell_command("ls", {"A": "x y", "B": "$(id)"}) == "export A='x y'; export B='$(id)'; ls"
    assert "exec bash" in (shell_command(None, {"A": "1"}) or "")
    with pytest.raises(ConfigurationError):
        shell_command("ls", {"A;rm": "1"})


def test_threads_may_send_while_one_reads() -> None:
    client, server = pair(max_message=1 << 20)
    threads = [
        threading.Thread(
            target=lambda: [client.send_binary(b"\x00" + bytes(5000)) for _ in range(20)]
        )
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    data = b""
    server.settimeout(5)
    while len(data) < 80 * (5001 + 8):
        data += server.recv(1 << 16)
    for thread in threads:
        thread.join()
    read = reader(data)
    frames = [ws.read_frame(read, 1 << 20, masked=True) for _ in range(80)]
    assert all(f.payload == b"\x00" + bytes(5000) for f in frames)


# -- attacks (issue 46's review) ---------------------------------------------------------------


def test_a_ping_between_fragments_of_a_message_near_the_cap_is_answered() -> None:
    # a control frame is up to 125 bytes whatever the message's fragments added up to so far
    client, server = pair(max_message=10)
    server.sendall(bytes([0x01, 0x09]) + b"123456789" + bytes([0x89, 0x05]) + b"hello")
    server.sendall(bytes([0x80, 0x01]) + b"0")
    assert client.recv() == (ws.OP_TEXT, b"1234567890")
    assert [(f.opcode, f.payload) for f in received_frames(server)] == [(ws.OP_PONG, b"hello")]


def test_an_endless_fragmented_message_is_refused() -> None:
    # empty continuations (or pings inside a message) add no bytes: the cap alone never ends it
    client, server = pair(max_message=1000)
    server.sendall(bytes([0x01, 0x01]) + b"a" + bytes([0x00, 0x00]) * 5000)
    with pytest.raises(ws.ProtocolError) as caught:
        client.recv()
    assert caught.value.code == ws.TOO_BIG
