"""/proc parsers: stat lines with odd names, listening sockets."""

from app.core.hosts.procfs import listening_ports, parse_stat_line, parse_stat_text

STAT = "4676 (sglang::sched) S 1 4676 4676 0 -1 4194560 160 0 0 0 0 0 0 0 20 0 1 0 26974 2281472 197 x"


def test_stat_line_fields():
    info = parse_stat_line(STAT)
    assert info is not None
    assert (info.pid, info.ppid, info.pgid, info.state, info.name, info.start_time) == (
        4676, 1, 4676, "S", "sglang::sched", "26974"
    )


def test_name_with_spaces_and_parentheses():
    line = STAT.replace("(sglang::sched)", "(a) b (c)")
    info = parse_stat_line(line)
    assert info is not None and info.name == "a) b (c" and info.pgid == 4676


def test_garbage_is_skipped():
    assert parse_stat_line("nonsense") is None
    assert parse_stat_text("junk\n" + STAT + "\n\n") [0].pid == 4676


def test_listening_ports_only_listen_state():
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue\n"
        "   0: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000\n"
        "   1: 0100007F:1F90 0100007F:D2A4 01 00000000:00000000 00:00000000 00000000\n"
        "   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 0\n"
    )
    assert listening_ports(text) == {30000, 8000}
