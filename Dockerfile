# lace-proxy's image: `docker build -t lace-proxy:0.1.0 .` from the repository's root.
# The build stage compiles the Cython core into a wheel; the runtime stage has the tools the
# proxy drives (nft, ip, conntrack) and those an operator needs on the node (ipvsadm to read
# IPVS; iptables, ip6tables and ipset for `lace-proxy cleanup --kube-proxy`).
ARG PYTHON_VERSION=3.11
ARG DEBIAN=bookworm

FROM python:${PYTHON_VERSION}-slim-${DEBIAN} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY ext/ ext/
COPY lace_proxy/ lace_proxy/
# Our wheel (compiled core inside) and a wheel of every dependency, for an offline install.
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
    && ls /wheels/lace_proxy-*-cp*-linux_*.whl

FROM python:${PYTHON_VERSION}-slim-${DEBIAN}
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        nftables iproute2 conntrack ipvsadm iptables ipset bird2 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels lace-proxy \
    && rm -rf /wheels \
    && lace-proxy version | grep -q "(compiled service table, compiled nftables codec, compiled IPVS codec, compiled endpoint parse)"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
ENTRYPOINT ["lace-proxy"]
CMD ["run"]
