"""A decode request that streamed fewer tokens than it asked for was always put down to
``ignore_eos`` not honoured; an engine stopping (SIGTERM: its streams end early with no
finish reason, or ``abort``) was reported as that. The line now says what the stream's
finish reason tells."""

from __future__ import annotations

from typing import Any

import pytest

from gpugov.study.emulate.server import EmulatorServer
from gpugov.study.openai_client import StreamTiming, request_body, stream_completion
from gpugov.study.profiler import measure
from gpugov.study.profiler.measure import Measurer, ProfileRunError


class _Sampler:
    def window(self, start: float, end: float) -> list[Any]:
        return []


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("stop", "it stopped at an end-of-sequence token (is ignore_eos honoured?)"),
        (
            "length",
            "it reached a length limit: the engine's max_model_len, or the engine streams "
            "several tokens per event (--stream-interval above 1, speculative decoding), "
            "from which a decode iteration cannot be timed",
        ),
        ("abort", "the engine ended it (finish reason 'abort': did it stop or restart?)"),
        (None, "the engine ended it (no finish reason: did it stop or restart?)"),
    ],
)
def test_a_short_decode_stream_says_why_it_ended(
    monkeypatch: pytest.MonkeyPatch, reason: str | None, said: str
) -> None:
    def concurrent(url: str, bodies: Any, *args: Any, **kwargs: Any) -> list[StreamTiming]:
        timings = []
        for index, _ in enumerate(bodies):
            timing = StreamTiming(prompt_tokens=128, max_tokens=64, sent_s=0.0)
            timing.token_s = [0.01 * i for i in range(64 if index else 51)]
            timing.finish_reason = "length" if index else reason
            timings.append(timing)
        return timings

    monkeypatch.setattr(measure, "_concurrent", concurrent)
    measurer = Measurer("http://127.0.0.1:9", "m", _Sampler())  # type: ignore[arg-type]
    with pytest.raises(ProfileRunError) as caught:
        measurer.decode(4, 128, 64, attempts=1)
    assert str(caught.value) == (
        f"engine at http://127.0.0.1:9: a decode request streamed 51 of 64 tokens: {said}"
    )


def test_the_stream_keeps_its_finish_reason(emulator: EmulatorServer) -> None:
    body = request_body("gpugov-emulated", 32, 8, "ids", salt=1)
    timing = stream_completion(emulator.url, body, timeout_s=30)
    assert timing.error is None and len(timing.token_s) == 8
    assert timing.finish_reason == "length"  # ignore_eos: every token asked for
