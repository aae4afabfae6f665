from helpers import make_job, make_targets

from sift import dcache


def test_round_trip(store: dcache.SerializedSqliteDatabase) -> None:
    dcache.create_batch_job(make_job(), make_targets(3))
    job = dcache.batch_job("job-1")
    assert job is not None and job.caller == "alice" and job.lease == 1_000
    targets = dcache.batch_targets("job-1")
    assert targets is not None and [t.idx for t in targets] == [0, 1, 2]
