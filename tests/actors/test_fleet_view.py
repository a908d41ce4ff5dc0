"""The fleet's readable report (``actors.fleet.view.lines``): each part says when it is empty,
and past :data:`~actors.fleet.view.SHOWN_ROWS` rows it shows that many and counts the rest."""

from __future__ import annotations

from actors.fleet.view import SHOWN_ROWS, lines


def test_an_empty_fleet_says_so_in_each_part() -> None:
    assert lines({"hosts": [], "leases": []}) == [
        "fleet:",
        "  hosts:",
        "    (none has beaten yet)",
        "  leases:",
        "    (none taken yet)",
    ]


def test_a_large_fleet_shows_the_first_rows_and_counts_the_rest() -> None:
    hosts = [{"host_id": f"h{i}", "heartbeat_age_s": 1.0} for i in range(SHOWN_ROWS + 3)]
    leases = [
        {"resource": f"agent:a{i}", "holder": None, "epoch": 1, "state": "free"}
        for i in range(SHOWN_ROWS + 1)
    ]
    out = lines({"hosts": hosts, "leases": leases})
    at = out.index("  leases:")
    assert out[:3] == ["fleet:", "  hosts:", "    h0: last heartbeat 1 s ago"]
    assert len(out[2:at]) == SHOWN_ROWS + 1 and out[at - 1] == "    … and 3 more"
    assert out[at + 1] == "    agent:a0: free (epoch 1)"
    assert len(out[at + 1 :]) == SHOWN_ROWS + 1 and out[-1] == "    … and 1 more"
