from __future__ import annotations

import gzip
import io
import lzma
from pathlib import Path

import pytest

from gfair.data import PHILLY_TRACE
from gfair.sim.trace import TraceError, parse_trace, read_trace

GFAIR = """submit_time_s,user,gpus,duration_s,job_type,tickets
10,alice,1,3600,ResNet-50 (batch size 32),4
0,bob,4,120,,
5,alice,2,60,,
"""

PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,11cb48
2017-10-09 06:13:03,2951.0,2,5902.0,6214e9
2017-10-09 06:13:36,2759.0,8,22072.0,6214e9
"""

PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def parse(text: str) -> object:
    return parse_trace(io.StringIO(text), source="t.csv")


def test_gfair_rows_are_sorted_by_submission_and_keep_file_indices_as_ids() -> None:
    trace = parse_trace(io.StringIO(GFAIR))
    assert trace.format == "gfair"
    assert [(j.id, j.user, j.gpus, j.submit_s) for j in trace.jobs] == [
        ("1", "bob", 4, 0.0),
        ("2", "alice", 2, 5.0),
        ("0", "alice", 1, 10.0),
    ]
    assert trace.jobs[2].job_type == "ResNet-50 (batch size 32)"
    assert trace.jobs[0].job_type is None
    assert trace.jobs[2].duration_s == 3600.0
    assert trace.tickets == {"alice": 4.0}
    assert trace.users == ("bob", "alice")


def test_philly_timestamps_become_seconds_since_the_earliest_submission() -> None:
    trace = parse_trace(io.StringIO(PHILLY))
    assert trace.format == "philly"
    assert [(j.id, j.user, j.gpus, j.submit_s, j.duration_s) for j in trace.jobs] == [
        ("1", "6214e9", 2, 0.0, 2951.0),
        ("2", "6214e9", 8, 33.0, 2759.0),
        ("0", "11cb48", 1, 2932.0, 66.0),
    ]
    assert trace.tickets == {}


def test_columns_may_come_in_any_order_with_an_explicit_job_id() -> None:
    text = "job_id,user,duration_s,gpus,submit_time_s\nj-1,ann,30,2,7\nj-2,ann,30,1,3\n"
    trace = parse_trace(io.StringIO(text))
    assert [(j.id, j.gpus, j.submit_s) for j in trace.jobs] == [("j-2", 1, 3.0), ("j-1", 2, 7.0)]


def test_arrays_and_dependencies_read_as_gfair_submit_has_them() -> None:
    text = (
        "job_id,submit_time_s,user,gpus,duration_s,array,array_limit,after_ok\n"
        "s-0,0,ann,1,30,s,,\n"
        "s-1,0,ann,1,30,s,2,\n"
        "train,5,ann,2,60,,,s-0 s-1\n"
    )
    jobs = {job.id: job for job in parse_trace(io.StringIO(text)).jobs}
    # The limit one row gives holds for the whole array, rows before it included.
    assert [(jobs[j].array, jobs[j].array_limit) for j in ("s-0", "s-1")] == [("s", 2)] * 2
    assert jobs["train"].after_ok == ("s-0", "s-1") and jobs["train"].array is None


def test_a_jobs_image_is_carried_with_it() -> None:
    text = "submit_time_s,user,gpus,duration_s,image\n0,ann,1,30,registry.example.com/t:1\n"
    text += "1,ann,1,30,\n"
    images = [job.image for job in parse_trace(io.StringIO(text)).jobs]
    assert images == ["registry.example.com/t:1", None]


@pytest.mark.parametrize("suffix", [".xz", ".gz", ".csv"])
def test_compressed_files_are_read_by_suffix(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"trace{suffix}"
    opener = {".xz": lzma.open, ".gz": gzip.open}.get(suffix)
    if opener is None:
        path.write_text(PHILLY)
    else:
        with opener(path, "wt") as stream:
            stream.write(PHILLY)
    trace = read_trace(path)
    assert len(trace.jobs) == 3
    assert trace.source == str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("submit_time_s,user,gpus,duration_s\n0,a,1,10\n0,b,x,10\n", "t.csv:3: column 'gpus'"),
        ("submit_time_s,user,gpus,duration_s\n0,a,0,10\n", "t.csv:2: column 'gpus'"),
        ("submit_time_s,user,gpus,duration_s\n\n\n-1,a,1,10\n", "t.csv:4: column 'submit_time_s'"),
        ("submit_time_s,user,gpus,duration_s\n0,a,1,0\n", "t.csv:2: column 'duration_s'"),
        ("submit_time_s,user,gpus,duration_s\n0,a,1,nan\n", "t.csv:2: column 'duration_s'"),
        ("submit_time_s,user,gpus,duration_s\n0,a b,1,5\n", "t.csv:2: column 'user'"),
        ("submit_time_s,user,gpus,duration_s\n0,a,1\n", "t.csv:2: expected 4 fields, got 3"),
        (
            "submit_time_s,user,gpus,duration_s,tickets\n0,a,1,5,2\n1,a,1,5,3\n",
            "t.csv:3: column 'tickets': user 'a' has 3 tickets here but 2 earlier",
        ),
        ("submit_time_s,user,gpus,duration_s,tickets\n0,a,1,5,-2\n", "t.csv:2: column 'tickets'"),
        (
            "job_id,submit_time_s,user,gpus,duration_s\nx,0,a,1,5\nx,0,a,1,5\n",
            "t.csv:3: column 'job_id': duplicate job id 'x'",
        ),
        (PHILLY_HEADER + "yesterday,1,1,1,c\n", "t.csv:2: column 'timestamp'"),
        (PHILLY_HEADER + "2017-10-09 07:01:55,1,1,?,c\n", "t.csv:2: column 'gpu_time'"),
        ("a,b,c\n1,2,3\n", "t.csv:1: unrecognised header"),
        ("submit_time_s,user,gpus,duration_s,colour\n", "t.csv:1: unknown column(s) ['colour']"),
        ("", "t.csv:1: empty file"),
        (
            "submit_time_s,user,gpus,duration_s,array,array_limit\n0,a,1,5,s,2\n0,a,1,5,s,3\n",
            "t.csv:3: column 'array_limit': array 's' of 'a' runs 3 at once here but 2 earlier",
        ),
        (
            "submit_time_s,user,gpus,duration_s,array_limit\n0,a,1,5,2\n",
            "t.csv:2: column 'array_limit': array_limit needs an array",
        ),
        (
            "job_id,submit_time_s,user,gpus,duration_s,after_ok\nx,0,a,1,5,\ny,0,b,1,5,x\n",
            "t.csv:3: job 'y' waits for 'x', which is no job of 'b' in this trace",
        ),
    ],
)
def test_malformed_input_names_line_and_column(text: str, message: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse(text)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_quoted_field_spanning_lines_keeps_physical_line_numbers() -> None:
    text = 'submit_time_s,user,gpus,duration_s,job_type\n0,a,1,5,"two\nlines"\n0,a,z,5,\n'
    with pytest.raises(TraceError, match=r"^t.csv:4: column 'gpus'"):
        parse(text)


def test_an_unreadable_file_is_a_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.xz"
    path.write_bytes(b"not xz at all")
    with pytest.raises(TraceError, match=r"broken\.xz: cannot read"):
        read_trace(path)


def test_head_keeps_the_first_jobs_and_their_users_tickets() -> None:
    trace = parse_trace(io.StringIO(GFAIR)).head(2)
    assert [j.id for j in trace.jobs] == ["1", "2"]
    assert trace.tickets == {"alice": 4.0}
    assert parse_trace(io.StringIO(GFAIR)).head(1).tickets == {}


def test_the_packaged_philly_trace_reads_whole() -> None:
    trace = read_trace(PHILLY_TRACE)
    assert len(trace.jobs) == 82_247
    assert len(trace.users) == 15
    assert trace.jobs[0].submit_s == 0.0
    assert all(a.submit_s <= b.submit_s for a, b in zip(trace.jobs, trace.jobs[1:], strict=False))
    assert sum(j.gpus == 1 for j in trace.jobs) == 76_627
