"""Build the compiled cores from ext/*.pyx: the service table, the nf_tables and IPVS codecs,
the endpoint parse.

Set LACE_PROXY_NO_EXTENSIONS=1 to install the pure-Python twin only (no compiler needed).
"""

import os

from setuptools import setup

# The modules are translated and compiled side by side, without debug information (a
# quarter of gcc's time on table.c): a newcomer's demo waits on this build.
JOBS = os.cpu_count() or 1

if os.environ.get("LACE_PROXY_NO_EXTENSIONS"):
    ext_modules = []
else:
    from Cython.Build import cythonize
    from setuptools import Extension

    flags = {"extra_compile_args": ["-g0"]}
    # The codecs and the endpoint parse `include` ext/netaddr.pxi: named so that a change to it
    # rebuilds them.
    codec = {**flags, "depends": ["ext/netaddr.pxi"]}
    ext_modules = cythonize(
        [
            Extension("lace_proxy.table._ctable", ["ext/table.pyx"], **flags),
            Extension("lace_proxy.dataplane.nftables._ccodec", ["ext/nftcodec.pyx"], **codec),
            Extension("lace_proxy.dataplane.ipvs._ccodec", ["ext/ipvscodec.pyx"], **codec),
            Extension("lace_proxy.model._cplain", ["ext/plain.pyx"], **codec),
        ],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        nthreads=JOBS,
    )

setup(ext_modules=ext_modules, options={"build_ext": {"parallel": JOBS}})
