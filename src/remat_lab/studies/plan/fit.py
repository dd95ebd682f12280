"""The planner's model: a family's compiled peak and predicted step as lines in its per-device batch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """``y = a + slope * b`` through two compiled points (one point: the slope borrowed)."""

    a: float
    slope: float

    def at(self, b: float) -> float:
        return self.a + self.slope * b

    @classmethod
    def through(cls, p: tuple[float, float], q: tuple[float, float]) -> Line:
        (b1, y1), (b2, y2) = sorted((p, q))
        if b2 == b1:
            return cls(y1, 0.0)
        slope = (y2 - y1) / (b2 - b1)
        return cls(y1 - slope * b1, slope)

    @classmethod
    def with_intercept(cls, a: float, p: tuple[float, float]) -> Line:
        """Through ``p`` with intercept ``a`` (the batch-independent part another plan's line measured
        on the same mesh: parameters, gradients, optimizer state, gathered weights)."""
        b, y = p
        return cls(a, (y - a) / b if b else 0.0)


def peak_line(points: list[tuple[int, int]], intercept: float | None) -> Line | None:
    """A family's peak in its per-device batch: through its two compiled points, or through one and
    the mesh's intercept; None with no point."""
    pts = sorted(set(points))
    if len(pts) >= 2:
        return Line.through(pts[0], pts[-1])
    if pts and intercept is not None:
        return Line.with_intercept(intercept, pts[0])
    return None


def step_line(points: list[tuple[int, float]], shape: Line | None) -> Line | None:
    """A family's predicted step in its per-device batch (one microbatch): through two points, or
    through one with the shape (the relative slope) of ``shape``, another family's line."""
    pts = sorted(set(points))
    if len(pts) >= 2:
        return Line.through(pts[0], pts[-1])
    if pts and shape is not None and shape.at(pts[0][0]) > 0:
        b, y = pts[0]
        scale = y / shape.at(b)
        return Line(shape.a * scale, shape.slope * scale)
    return None


def accumulated_step(line: Line, per_device_batch: int, microbatches: int) -> float:
    """A step of ``microbatches`` accumulated microbatches: each the line's step at its batch
    (each gathers the weights again and runs forward and backward; the update once is within the
    line's intercept and counted once more per extra microbatch: an upper estimate)."""
    return microbatches * line.at(per_device_batch)


def relative_error(predicted: float, compiled: float) -> float:
    """|predicted - compiled| / compiled."""
    return abs(predicted - compiled) / compiled if compiled else float("inf")
