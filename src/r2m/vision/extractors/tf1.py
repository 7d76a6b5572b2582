"""The authors' TensorFlow 1 image preprocessing, in numpy: TF1's bilinear resize and the fixed
resize-then-centre-crop their Inception-V4 inference code applies (used by ``inception_v4``)."""

from __future__ import annotations

import numpy as np
import torch


def tf1_axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One axis of a TF1 bilinear resize ``n_in -> n_out``: per output pixel, the low and high source
    indices and the float32 weight of the high one (also used by the GPU twin, ``gpu_decode.py``)."""
    src = np.arange(n_out, dtype=np.float64) * (n_in / n_out)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, (src - lo).astype(np.float32)


def tf1_resize_bilinear(a: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """TensorFlow 1's ``tf.image.resize_images`` (bilinear, ``align_corners=False``, no half-pixel
    centres, no antialiasing) of an ``[H, W, C]`` float array: output pixel ``i`` samples the input at
    ``i * in / out``, interpolating between the two neighbouring pixels (the last one repeated)."""
    h, w = a.shape[:2]
    y0, y1, dy = tf1_axis(h, out_h)
    x0, x1, dx = tf1_axis(w, out_w)
    top = a[y0][:, x0] * (1 - dx)[None, :, None] + a[y0][:, x1] * dx[None, :, None]
    bottom = a[y1][:, x0] * (1 - dx)[None, :, None] + a[y1][:, x1] * dx[None, :, None]
    return top * (1 - dy)[:, None, None] + bottom * dy[:, None, None]


class OfficialResizeCrop:
    """The authors' image preprocessing (UC-GAN / R²M TensorFlow code): resize the whole image to
    ``resize x resize`` with TF1 bilinear (aspect ratio not kept), then crop ``crop x crop``. Training
    there takes a random crop; their inference code takes the fixed centre crop ``[23:-24]`` (346 ->
    299), which is what a feature cache can hold. Returns float ``[3, crop, crop]`` in 0..255 units
    (the model scales it to [-1, 1], the official ``x * 2 - 1``)."""

    def __init__(self, resize: int = 346, crop: int = 299):
        if not 1 <= crop <= resize:
            raise ValueError(f"official preprocessing needs 1 <= crop <= resize, got crop {crop}, resize {resize}")
        self.resize, self.crop = resize, crop
        self.offset = (resize - crop) // 2  # 23 for 346 -> 299, as [23:-24]

    def __call__(self, img) -> torch.Tensor:
        a = np.asarray(img, dtype=np.float32)
        r = tf1_resize_bilinear(a, self.resize, self.resize)
        o, c = self.offset, self.crop
        return torch.from_numpy(np.ascontiguousarray(r[o:o + c, o:o + c])).permute(2, 0, 1).contiguous()
