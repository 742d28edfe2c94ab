"""The seed's ``taskd.python.adaptor``: only :mod:`taskd.python.adaptor.patch`."""
