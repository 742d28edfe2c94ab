"""The seed's ``taskd.python``: only :mod:`taskd.python.adaptor.patch`, for torchrun's import."""
