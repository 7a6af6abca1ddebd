"""The generated protocol code is importable from the shared library."""

from tidemark.v1 import common_pb2


def test_cdc_message_round_trips_through_bytes() -> None:
    msg = common_pb2.CdcMessage(
        progress=common_pb2.Progress(
            lower=common_pb2.Frontier(elements=[3]),
            upper=common_pb2.Frontier(elements=[]),
            counts=[common_pb2.TimeCount(time=4, count=2)],
        )
    )
    back = common_pb2.CdcMessage.FromString(msg.SerializeToString())
    assert back.WhichOneof("kind") == "progress"
    assert list(back.progress.lower.elements) == [3]
    assert list(back.progress.upper.elements) == []
    assert [(c.time, c.count) for c in back.progress.counts] == [(4, 2)]
