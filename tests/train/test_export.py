import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prorsa.train.export import read_batch, write_batch
from prorsa.train.samples import Sample


def test_a_batch_round_trips_and_is_plain_parquet(tmp_path):
    samples = [Sample((1, 2, 3, 4), (0, 0, 1, 1), (0.0, 0.0, -0.5, -0.25), 1.0, "s0-p0", 3, "a"),
               Sample((5, 6, 7), (0, 1, 0), (0.0, -1.5, 0.0), 0.0, "s0-p0", 2, "b")]
    path = write_batch(tmp_path / "batch.parquet", samples, [1.0, -1.0])
    back = read_batch(path)
    assert [e.sample for e in back] == samples and [e.advantage for e in back] == [1.0, -1.0]
    table = pq.read_table(path)  # what another trainer sees, without prorsa
    assert table.column_names == ["traj_id", "group", "policy_version", "token_ids", "loss_mask",
                                  "rollout_logprobs", "reward", "advantage"]
    assert table.column("loss_mask").to_pylist()[0] == [0, 0, 1, 1]
    assert [p.name for p in tmp_path.iterdir()] == ["batch.parquet"]


def test_other_parquet_files_are_refused(tmp_path):
    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="not a prorsa-rollout-batch"):
        read_batch(tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="2 samples but 1"):
        write_batch(tmp_path / "b.parquet", [Sample((1,), (0,), (0.0,), 0.0, "g", 0)] * 2, [0.0])
