"""The package version: the tensorizer API it mirrors (2.12.1) plus a post-release number, which
keeps `pip install tensorizer==2.12.1` (the reference) distinct from this package. The one
statement of it: pyproject.toml (the wheel) and CMakeLists.txt (`tensorizer --version`) read it."""

__version__ = "2.12.1.post1"
