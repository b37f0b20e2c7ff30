"""mmfeed.codecs: bytes to arrays. Video frames (decord and PyAV backends, GOP-coalesced batch decode, RGB or
YUV 4:2:0 planes converted later on the device by ``yuv420_to_rgb``), npy/npz and parquet arrays, and text
tokenizers.

>>> import tempfile, os
>>> from mmfeed.codecs import read_frames
>>> from mmfeed.testing import frame_pattern, read_index, write_video
>>> path = write_video(os.path.join(tempfile.mkdtemp(), "v.mp4"), frame_pattern(10, height=48, width=64))
>>> read_index(read_frames(path, indices=[0, 5, 9], backend="pyav")).tolist()
[0, 5, 9]
"""

from mmfeed.codecs.arrays import check_array, column_to_numpy, load_npy, load_npz
from mmfeed.codecs.batch import FrameRequest, VideoReaderCache, decode_batch
from mmfeed.codecs.colour import yuv420_to_rgb
from mmfeed.codecs.errors import DecodeError
from mmfeed.codecs.demux import VideoInfo, probe
from mmfeed.codecs.encode import encode_video
from mmfeed.codecs.text import ByteTokenizer, FixedLengthTokenizer, HFTokenizer, Tokenizer
from mmfeed.codecs.video import BACKENDS, DecodeOptions, VideoReader, choose_backend, open_reader, read_frames

__all__ = sorted(
    [
        "BACKENDS",
        "ByteTokenizer",
        "FixedLengthTokenizer",
        "DecodeError",
        "DecodeOptions",
        "FrameRequest",
        "HFTokenizer",
        "Tokenizer",
        "VideoInfo",
        "VideoReader",
        "VideoReaderCache",
        "check_array",
        "choose_backend",
        "column_to_numpy",
        "decode_batch",
        "encode_video",
        "load_npy",
        "load_npz",
        "open_reader",
        "probe",
        "read_frames",
        "yuv420_to_rgb",
    ]
)
