"""Videos read once, to the video budget: a file (decoded with PyAV), a list of frame files, or decoded frames.

A row's ``video`` becomes a :class:`Clip`: the frames :class:`VideoBudget` picks, each fitted to the
budget's frame size, with where they came from (the source's fps, which frames, of how many). Every consumer gets
the clip's frames as they are and its metadata (:meth:`Clip.metadata`): the processor, through
:func:`processor_kwargs`, never samples or resizes them again, so training, generation and evaluation see the same
frames and the same number of video tokens. Qwen2.5-VL places frames in time with the metadata's sampled fps
(``second_per_grid_ts``), Qwen3-VL writes its timestamps into the prompt from it.

PyAV (``av``, which qwen-vl-utils installs on every path) decodes files. An unreadable, missing or empty video is one
:class:`~suzak.SuzakError` line that names it.

>>> budget = VideoBudget(fps=2.0, max_frames=8, max_pixels=12544, factor=28)
>>> frames = [Image.new("RGB", (64, 48), (i, 0, 0)) for i in range(10)]
>>> clip = read_clip(frames, budget, fps=5.0)  # 2 s at 2 fps: 4 of the 10 frames
>>> clip.frames.shape, clip.indices, clip.metadata()["fps"]
((4, 56, 56, 3), (0, 3, 6, 9), 5.0)
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError
from qwen_vl_utils.vision_process import FRAME_FACTOR, smart_nframes

from suzak import SuzakError
from suzak.media.vision import (
    DEFAULT_MIN_PIXELS,
    PixelBudget,
    content_as_parts,
    fit_image,
    processor_name,
    smart_resize,
    vision_family,
)

__all__ = [
    "Clip",
    "DEFAULT_VIDEO_MAX_PIXELS",
    "VIDEO_COLUMN",
    "VideoBudget",
    "clip_key",
    "decode_file",
    "processor_kwargs",
    "read_clip",
    "row_clip",
    "temporal_factor",
    "video_of",
    "video_problem",
    "vllm_video",
    "with_video",
]

DEFAULT_VIDEO_MAX_PIXELS = 100352  # per frame: 128 tokens of 28×28 pixels (Video-R1's training setting), 98 of 32×32
VIDEO_COLUMN = "video"


def temporal_factor(source: Any) -> int | None:
    """Frames per temporal patch (``temporal_patch_size``: 2 in every supported family), read from the model's
    config or its processor's video processor; None for a text-only model.

    >>> from transformers import AutoConfig
    >>> temporal_factor(AutoConfig.for_model("qwen2_5_vl")), temporal_factor(AutoConfig.for_model("qwen3_vl"))
    (2, 2)
    """
    config = getattr(source, "config", None)
    if hasattr(config, "model_type"):
        source = config
    if hasattr(source, "model_type") and hasattr(source, "to_dict"):
        return int(source.vision_config.temporal_patch_size) if vision_family(source) is not None else None
    video_processor = getattr(source, "video_processor", source)
    size = getattr(video_processor, "temporal_patch_size", None)
    return int(size) if size else None


@dataclass(frozen=True)
class VideoBudget:
    """How every video is sampled and sized: qwen-vl-utils' video options, with the model's factor.

    ``fps``, ``min_frames`` and ``max_frames`` pick how many frames are read (``qwen_vl_utils.smart_nframes``: the
    video's length at ``fps``, within the bounds, rounded down to a multiple of the temporal patch); frames are spread
    evenly over the video. Each frame is fitted like an image (:func:`fit_image`) to [min_pixels, frame max], where
    the frame max is ``max_pixels``, lowered (as qwen-vl-utils does) so the frames together stay within
    ``total_pixels`` when that is set. Every ``temporal`` frames make one grid of (h/factor)·(w/factor) tokens.

    >>> from transformers import AutoConfig
    >>> budget = VideoBudget(fps=2.0, max_frames=8, max_pixels=50176).for_model(AutoConfig.for_model("qwen2_5_vl"))
    >>> budget.frame_count(total_frames=90, video_fps=30.0)  # 3 s at 2 fps: 6 frames
    6
    >>> budget.size(6, 240, 320), budget.tokens(6, 240, 320)  # 3 grids of 6 x 9 tokens
    ((168, 252), 162)
    """

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 16
    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_VIDEO_MAX_PIXELS
    total_pixels: int | None = None
    factor: int | None = None
    temporal: int = FRAME_FACTOR

    def __post_init__(self):
        if not self.fps > 0:
            raise ValueError(f"video fps must be positive, got {self.fps}")
        if not FRAME_FACTOR <= self.min_frames <= self.max_frames:
            raise ValueError(f"need {FRAME_FACTOR} <= video min_frames <= max_frames, got {self.min_frames} and "
                             f"{self.max_frames}")  # fmt: skip
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"need 0 < video min_pixels <= max_pixels, got {self.min_pixels} and {self.max_pixels}")
        if self.total_pixels is not None and self.total_pixels < self.min_pixels * self.max_frames:
            raise ValueError(f"video total_pixels {self.total_pixels} is below max_frames x min_pixels "
                             f"({self.max_frames} x {self.min_pixels})")  # fmt: skip

    def for_model(self, source: Any) -> VideoBudget:
        """This budget with the factor and temporal patch of the model behind ``source`` (as
        :meth:`PixelBudget.for_model`); unchanged for a text-only model."""
        image = PixelBudget(self.min_pixels, self.max_pixels, self.factor).for_model(source)
        temporal = temporal_factor(source) or self.temporal
        if temporal != FRAME_FACTOR:
            raise SuzakError(f"{processor_name(source)} groups {temporal} frames per temporal patch; qwen-vl-utils' frame "
                             f"sampling, which suzak's video budget uses, groups {FRAME_FACTOR}")  # fmt: skip
        return dataclasses.replace(self, factor=image.factor, temporal=temporal)

    def frame_count(self, total_frames: int, video_fps: float) -> int:
        """Frames read from a video of ``total_frames`` frames at ``video_fps`` (``qwen_vl_utils.smart_nframes``)."""
        if total_frames < self.temporal:
            raise ValueError(f"a video needs at least {self.temporal} frames, this one has {total_frames}")
        options = {"fps": self.fps, "min_frames": self.min_frames, "max_frames": self.max_frames}
        return smart_nframes(options, total_frames=total_frames, video_fps=video_fps)

    def frame_indices(self, total_frames: int, video_fps: float) -> list[int]:
        """Which of the video's frames are read: evenly spread, first and last included (as qwen-vl-utils reads).

        >>> VideoBudget(fps=1.0, min_frames=2).frame_indices(total_frames=10, video_fps=5.0)
        [0, 9]
        """
        count = self.frame_count(total_frames, video_fps)
        return np.linspace(0, total_frames - 1, count).round().astype(int).tolist()

    def frame_bounds(self, num_frames: int) -> tuple[int, int]:
        """(min, max) pixels of each of ``num_frames`` frames: qwen-vl-utils' per-frame cap under ``total_pixels``."""
        if self.total_pixels is None:
            return self.min_pixels, self.max_pixels
        cap = max(min(self.max_pixels, self.total_pixels / num_frames * self.temporal), int(self.min_pixels * 1.05))
        return self.min_pixels, int(cap)

    def size(self, num_frames: int, height: int, width: int) -> tuple[int, int]:
        """(h, w) each of ``num_frames`` frames of this size is fitted to."""
        low, high = self.frame_bounds(num_frames)
        return smart_resize(height, width, low, high, factor=self._factor())

    def tokens(self, num_frames: int, height: int, width: int) -> int:
        """Visual tokens of ``num_frames`` read frames of this size (before fitting)."""
        h, w = self.size(num_frames, height, width)
        return math.ceil(num_frames / self.temporal) * (h // self._factor()) * (w // self._factor())

    def fit(self, frame: Image.Image, num_frames: int) -> Image.Image:
        """One of ``num_frames`` read frames, fitted (:func:`fit_image`)."""
        low, high = self.frame_bounds(num_frames)
        return fit_image(frame, low, high, factor=self._factor())

    def _factor(self) -> int:
        if self.factor is None:
            raise ValueError("this video budget has no patch factor yet: VideoBudget.for_model(processor) sets the "
                             "model's")  # fmt: skip
        return self.factor


def video_of(row: Mapping[str, Any]) -> Any:
    """A data row's video (a path, frames, a decoded clip): the one a ``{"type": "video", "video": ...}`` part of the
    prompt holds, else the ``video`` column's; None for a row without one. The one place that knows where
    a row's video is (:func:`with_video` puts it back).

    >>> video_of({"video": "clip.mp4"}), video_of({"prompt": [{"role": "user", "content": [{"type": "video",
    ...     "video": "b.mp4"}, {"type": "text", "text": "?"}]}]}), video_of({"prompt": "text only"})
    ('clip.mp4', 'b.mp4', None)
    """
    for part in _video_parts(row.get("prompt")):
        if part.get("video") is not None:
            return part["video"]
    return row.get(VIDEO_COLUMN)


def _video_parts(prompt: Any) -> list[dict]:
    if not isinstance(prompt, list):
        return []
    return [part for message in prompt if isinstance(message, dict) and isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict) and part.get("type") == "video"]  # fmt: skip


def with_video(row: Mapping[str, Any], video: Any) -> dict:
    """A copy of a data row whose prompt's video part holds ``video`` (a decoded clip); a prompt without a video part
    gets one at the start of its first user turn, as TRL places a row's images.

    >>> row = with_video({"prompt": [{"role": "user", "content": "Which way?"}]}, "frames")
    >>> row["prompt"][0]["content"]
    [{'type': 'video', 'video': 'frames'}, {'type': 'text', 'text': 'Which way?'}]
    """
    row = dict(row)
    prompt = [dict(m) if isinstance(m, dict) else m for m in row.get("prompt") or []]
    if not prompt or not all(isinstance(m, dict) for m in prompt):
        raise SuzakError("a video row needs a conversational prompt (a list of chat messages) to place its video in")
    prompt = content_as_parts(prompt)
    if not _video_parts(prompt):
        first = next((m for m in prompt if m.get("role") == "user"), prompt[0])
        first["content"] = [{"type": "video"}, *(first.get("content") or [])]
    placed = False
    for message in prompt:
        parts = []
        for part in message.get("content") or []:
            if isinstance(part, dict) and part.get("type") == "video" and not placed:
                part, placed = {**part, "video": video}, True
            parts.append(part)
        message["content"] = parts
    row["prompt"] = prompt
    return row


def _bfloat16_exact(value: float) -> float:
    """``value`` rounded to the nearest number bfloat16 holds exactly (8 significant bits).

    >>> _bfloat16_exact(0.5), _bfloat16_exact(2 / 2.67), _bfloat16_exact(2 / 3)
    (0.5, 0.75, 0.66796875)
    """
    mantissa, exponent = math.frexp(value)
    return math.ldexp(round(mantissa * 256) / 256, exponent)


@dataclass(frozen=True, eq=False)
class Clip:
    """The frames of one video as every consumer sees them, and where they came from.

    ``frames``: (T, H, W, 3) uint8, fitted to the budget; ``fps``: the source's frames per second; ``indices``: which
    of the source's ``total_frames`` frames they are; ``source``: how messages name the video.
    """

    frames: np.ndarray
    fps: float
    indices: tuple[int, ...]
    total_frames: int
    source: str = "a video"

    def metadata(self) -> dict[str, Any]:
        """transformers' ``VideoMetadata`` fields of the clip: ``sampled_fps`` follows from them (its ``fps`` is the
        source's, nudged as :attr:`sampled_fps` says)."""
        _, height, width, _ = self.frames.shape
        fps = self.sampled_fps * self.total_frames / len(self.indices)
        return {"fps": fps, "frames_indices": list(self.indices), "total_num_frames": self.total_frames,
                "height": height, "width": width}  # fmt: skip

    @property
    def sampled_fps(self) -> float:
        """Frames per second of the clip itself, how far apart in time its frames are, as every consumer is told:
        nudged (by at most 0.4%) so that a frame pair lasts a number of seconds that bfloat16 holds exactly.

        Qwen2.5-VL places frame pair ``k`` at time position ``floor(k * second_per_grid_ts * tokens_per_second)``.
        vLLM keeps ``second_per_grid_ts`` in the model's dtype (bf16 on a GPU) and the policy in float32, so for an
        arbitrary rate the two can floor to different positions (a third of 16-frame clips of 2-120 s have such a
        pair at Qwen2.5-VL's 2 tokens a second); with exact seconds every engine gets the same positions.

        >>> Clip(np.zeros((8, 28, 28, 3), np.uint8), fps=2.67, indices=tuple(range(8)), total_frames=8).sampled_fps
        2.6666666666666665
        """
        exact = len(self.indices) / self.total_frames * self.fps
        return FRAME_FACTOR / _bfloat16_exact(FRAME_FACTOR / exact)  # FRAME_FACTOR: frames per temporal patch


@dataclass(kw_only=True)
class VideoBudgetArguments:
    """The video budget's command-line and recipe fields (``video_*``), shared by training (``SuzakArguments``) and
    ``python -m suzak.eval``, so a checkpoint is evaluated with the flags it was trained with."""

    video_fps: float = field(
        default=2.0,
        metadata={"help": "Video budget: frames read per second of video (qwen-vl-utils' fps), within "
                          "video_min_frames..video_max_frames; a list of frames is read at the row's video_fps."},
    )  # fmt: skip
    video_min_frames: int = field(default=4, metadata={"help": "Video budget: fewest frames read from a video."})
    video_max_frames: int = field(
        default=16, metadata={"help": "Video budget: most frames read from a video (2 frames make one token grid)."}
    )
    video_min_pixels: int = field(
        default=DEFAULT_MIN_PIXELS, metadata={"help": "Video budget: lower bound of each frame's pixels."}
    )
    video_max_pixels: int = field(
        default=DEFAULT_VIDEO_MAX_PIXELS,
        metadata={"help": f"Video budget: upper bound of each frame's pixels ({DEFAULT_VIDEO_MAX_PIXELS} = "
                          f"{DEFAULT_VIDEO_MAX_PIXELS // 784} tokens of 28x28 pixels per 2 frames)."},
    )  # fmt: skip
    video_total_pixels: int | None = field(
        default=None,
        metadata={"help": "Video budget: bound on all frames' pixels together (qwen-vl-utils' total_pixels): a long "
                          "video's frames are made smaller to fit it. None: no bound beyond video_max_pixels."},
    )  # fmt: skip

    def video_budget(self) -> VideoBudget:
        """The video budget of these fields, without the model's factor (``VideoBudget.for_model`` sets it)."""
        return VideoBudget(self.video_fps, self.video_min_frames, self.video_max_frames, self.video_min_pixels,
                           self.video_max_pixels, self.video_total_pixels)  # fmt: skip


# A clip's frames are sampled and fitted already: the processor (transformers', or vLLM's through it) must take them as
# they are, and cap each frame's pixels as qwen-vl-utils does (transformers 5.17 warns that it will from v5.22).
NO_RESAMPLING = {"do_sample_frames": False, "do_resize": False, "cap_pixels_per_frame": True}


def processor_kwargs(clips: Sequence[Clip]) -> dict[str, Any]:
    """Keyword arguments for a processor call (or ``apply_chat_template``'s ``processor_kwargs``) on these clips, in
    the order their videos appear: their metadata, and no frame sampling or resizing of the processor's own."""
    return {"video_metadata": [clip.metadata() for clip in clips], "videos_kwargs": dict(NO_RESAMPLING)}


def vllm_video(clip: Clip, processor: Any) -> tuple[Any, dict[str, Any]]:
    """(the ``multi_modal_data["video"]`` item, the request's ``mm_processor_kwargs``) that make vLLM 0.24's
    processor read ``clip`` as :func:`processor_kwargs` makes transformers read it: the same frames, no sampling or
    resizing of its own, and the same times.

    Qwen3-VL and Qwen3.5 (``Qwen3VLProcessor``) write timestamps from the clip's metadata, which vLLM takes beside the
    frames. For Qwen2-VL and Qwen2.5-VL vLLM drops metadata given that way, and Qwen2.5-VL's M-RoPE would place the
    frames at transformers' default 24 fps (``second_per_grid_ts`` 2/24 instead of 2/sampled fps); given as the
    processor's ``video_metadata`` it reaches transformers.
    """
    from transformers import Qwen3VLProcessor

    videos = dict(NO_RESAMPLING)
    if isinstance(processor, Qwen3VLProcessor):
        return (clip.frames, clip.metadata() | {"do_sample_frames": False}), videos
    return clip.frames, videos | {"video_metadata": [clip.metadata()]}


def clip_key(source: Any, fps: float | None = None) -> Any:
    """A key under which equal video sources (a path, or frames of equal pixels) read to the same clip: a batch holds
    each prompt ``num_generations`` times, each a separately decoded copy of its frames.

    >>> clip_key("a.mp4") == clip_key("a.mp4"), clip_key([Image.new("RGB", (2, 2))]) == clip_key([Image.new("RGB", (2, 2))])
    (True, True)
    """
    if isinstance(source, (str, os.PathLike)):
        return ("path", os.fspath(source), fps)
    if isinstance(source, np.ndarray):
        return ("array", source.shape, hashlib.sha1(np.ascontiguousarray(source).tobytes()).hexdigest(), fps)
    if isinstance(source, Sequence):
        digest = hashlib.sha1()
        for frame in source:
            if isinstance(frame, Image.Image):
                digest.update(f"{frame.mode}{frame.size}".encode())
                digest.update(frame.tobytes())
            else:
                digest.update(repr(frame).encode())
        return ("frames", len(source), digest.hexdigest(), fps)
    return ("object", id(source), fps)


def _name(source: Any) -> str:
    return str(source) if isinstance(source, (str, os.PathLike)) else f"a video of {type(source).__name__}"


def decode_file(path: str | os.PathLike, pick: Callable[[int, float], list[int]] | None = None
                ) -> tuple[list[Image.Image], list[int], int, float]:  # fmt: skip
    """(frames, their indices, the video's frame count, its frames per second) of a video file, decoded with PyAV.

    ``pick(total_frames, fps)`` says which frames to keep (default: all); only those are converted to RGB images, so
    a long video costs one decoding pass, not a picture of every frame. The frame count is the container's, or its
    video packets counted when the container does not say; should decoding yield fewer frames than that count, the
    pick is made again from the frames that decoded.
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise SuzakError(f"video {path} does not exist")
    pick = pick or (lambda total, fps: list(range(total)))
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise SuzakError(f"video {path} has no video stream")
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.base_rate or 0)
            total = stream.frames or sum(1 for packet in container.demux(stream) if packet.size)
        if total == 0:
            raise SuzakError(f"video {path} has no frames")
        if fps <= 0:
            raise SuzakError(f"video {path} does not say its frame rate")
        wanted = pick(total, fps)
        frames, decoded = _decode(path, set(wanted))
        if decoded == 0:
            raise SuzakError(f"video {path} has no frames")
        if decoded < total and max(wanted) >= decoded:  # the container overstated its length
            total, wanted = decoded, pick(decoded, fps)
            frames, _ = _decode(path, set(wanted))
    except SuzakError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as error:
        raise SuzakError(f"video {path} cannot be decoded: {error}") from None
    return [frames[i] for i in wanted], wanted, total, fps


def _decode(path: Path, wanted: set[int]) -> tuple[dict[int, Image.Image], int]:
    """The wanted frames (by decoding order) as RGB images, and how many frames decoded in all."""
    import av

    frames: dict[int, Image.Image] = {}
    count = 0
    with av.open(str(path)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index in wanted:
                frames[index] = frame.to_image()
            count = index + 1
    return frames, count


def _frame_file(path: str | os.PathLike | io.BytesIO) -> Image.Image:
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except FileNotFoundError:
        raise SuzakError(f"video frame {path} does not exist") from None
    except (UnidentifiedImageError, OSError) as error:
        where = "stored in the dataset" if isinstance(path, io.BytesIO) else path
        raise SuzakError(f"video frame {where} cannot be read: {error}") from None


def _frames(source: Any) -> list[Image.Image]:
    if isinstance(source, np.ndarray):
        if source.ndim != 4 or source.shape[-1] != 3:
            raise SuzakError(f"decoded video frames must be an array of shape (frames, height, width, 3), got "
                             f"{source.shape}")  # fmt: skip
        return [Image.fromarray(frame.astype(np.uint8), "RGB") for frame in source]
    if isinstance(source, Sequence) and not isinstance(source, str):
        frames = []
        for frame in source:
            if isinstance(frame, Image.Image):
                frames.append(frame)
            elif isinstance(frame, (str, os.PathLike)):
                frames.append(_frame_file(frame))
            elif isinstance(frame, Mapping) and frame.get("bytes"):  # a datasets Image() cell read undecoded
                frames.append(_frame_file(io.BytesIO(frame["bytes"])))
            elif isinstance(frame, Mapping) and frame.get("path"):
                frames.append(_frame_file(frame["path"]))
            else:
                raise SuzakError(f"a video frame must be an image or a path to one, got {type(frame).__name__}")
        return frames
    raise SuzakError(f"a video must be a file path, a list of frames (images or their paths) or an array of frames, "
                     f"got {type(source).__name__}")  # fmt: skip


def read_clip(source: Any, budget: VideoBudget, *, fps: float | None = None) -> Clip:
    """The clip the model sees of ``source``: a video file, a list of frames (images or paths) or a (T, H, W, 3)
    array. ``fps`` is the frame rate of a list or array (default: the budget's, so every frame up to
    ``max_frames`` is read); a file says its own."""
    try:
        if isinstance(source, (str, os.PathLike)):
            frames, indices, total, rate = decode_file(source, lambda count, rate: budget.frame_indices(count, rate))
        else:
            every, rate = _frames(source), float(fps or budget.fps)
            if not every:
                raise SuzakError("a video has no frames")
            indices, total = budget.frame_indices(len(every), rate), len(every)
            frames = [every[i] for i in indices]
    except ValueError as error:
        raise SuzakError(f"{_name(source)}: {error}") from None
    picked = [budget.fit(frame, len(indices)) for frame in frames]
    if len({frame.size for frame in picked}) > 1:
        raise SuzakError(f"{_name(source)}: its frames differ in size ({sorted({f.size for f in picked})})")
    array = np.stack([np.asarray(frame, dtype=np.uint8) for frame in picked])
    return Clip(array, rate, tuple(indices), total, _name(source))


def row_clip(row: Mapping[str, Any], budget: VideoBudget, memo: dict | None = None) -> Clip | None:
    """A data row's video (:func:`suzak.media.video.video_of`) read to ``budget`` (its ``video_fps`` for a frame list);
    the clip already placed in it as it is; None for a row without one. Rows read with the same ``memo`` dict read a
    video they share once (:func:`clip_key`), as :func:`suzak.media.vision.fit_row_images` resizes a shared image once."""
    video = video_of(row)
    if video is None or isinstance(video, Clip):
        return video
    fps = row.get("video_fps")
    if memo is None:
        return read_clip(video, budget, fps=fps)
    key = clip_key(video, fps)
    if key not in memo:
        memo[key] = read_clip(video, budget, fps=fps)
    return memo[key]


def video_problem(value: Any) -> str:
    """Why a ``video`` cell cannot be trained on ('' when it can), cheaply, before step 1: a file is opened and its
    first frame decoded; a list of frames needs 2 or more, each stored bytes, a path or an image.

    >>> video_problem("missing.mp4"), video_problem([{"bytes": b"x", "path": None}]), video_problem(None)
    ('video missing.mp4 does not exist', 'a video needs at least 2 frames, this one has 1', 'no video')
    """
    if value is None:
        return "no video"
    if isinstance(value, (str, os.PathLike)):
        return _file_problem(Path(value))
    if isinstance(value, np.ndarray):
        return "" if value.ndim == 4 and value.shape[-1] == 3 and len(value) >= 2 else f"frames of shape {value.shape}"
    if not isinstance(value, Sequence):
        return f"a video must be a file path or a list of frames, got {type(value).__name__}"
    if len(value) < 2:
        return f"a video needs at least 2 frames, this one has {len(value)}"
    for frame in value:
        if isinstance(frame, Image.Image):
            continue
        stored = (
            frame if isinstance(frame, Mapping) else {"path": frame} if isinstance(frame, (str, os.PathLike)) else None
        )
        if stored is None or not (stored.get("bytes") or stored.get("path")):
            return f"a video frame must be an image or a path to one, got {type(frame).__name__}"
        if not stored.get("bytes") and not Path(stored["path"]).is_file():
            return f"video frame {stored['path']} does not exist"
    return ""


def _file_problem(path: Path) -> str:
    import av

    if not path.is_file():
        return f"video {path} does not exist"
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return f"video {path} has no video stream"
            if next(container.decode(video=0), None) is None:
                return f"video {path} has no frames"
    except (av.error.FFmpegError, OSError, ValueError) as error:
        return f"video {path} cannot be decoded: {error}"
    return ""
