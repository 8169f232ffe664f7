# One image with every gpushare entry point: gpushare, gpushare-device-plugin,
# gpushare-extender, gpushare-isolation, cgpu-smi, kubectl-inspect-cgpu.
# The Helm chart picks the entry point per container with `command:`.
#
#   docker build -t gpushare/gpushare:dev .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- builder: the project and every dependency as wheels (nothing compiled at runtime)
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /build
# The wheel carries the CUDA interposer, compiled from C by setup.py.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY src ./src
RUN pip wheel --wheel-dir /wheels .

# ---- runtime: slim Python, the wheels installed offline into a venv, a non-root user.
# scripts/build-image builds this same image without Docker or a registry (Debian
# bookworm from Debian's packages instead of this base); tests/test_dockerfile.py
# holds the two to the same venv, user, environment, command and removals.
FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PATH=/opt/gpushare/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 gpushare \
 && useradd --system --uid 10001 --gid gpushare --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin gpushare
COPY --from=builder /wheels /tmp/wheels
# No pip or setuptools at run time, and not the Kubernetes client's asyncio copy of
# itself (68 MB that no component imports).
RUN python -m venv /opt/gpushare \
 && /opt/gpushare/bin/pip install --no-index --find-links /tmp/wheels kube-gpushare \
 && /opt/gpushare/bin/pip uninstall --quiet --yes pip setuptools \
 && rm -rf /tmp/wheels /opt/gpushare/lib/python3.11/site-packages/kubernetes/aio
# Fail the build if a console script of the project is missing or does not import.
RUN python -c "import importlib.metadata as m, shutil; \
eps = m.distribution('kube-gpushare').entry_points.select(group='console_scripts'); \
missing = [e.name for e in eps if not shutil.which(e.name)]; \
assert not missing, f'console scripts missing: {missing}'; \
[e.load() for e in eps]; print('entry points:', ' '.join(sorted(e.name for e in eps)))"
COPY examples /usr/share/gpushare/examples
# The extender and the CLIs run as this user; the chart runs the node containers as
# root where the kubelet's directories and other containers' processes require it.
USER 10001:10001
CMD ["gpushare", "--help"]
