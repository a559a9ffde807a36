# metricsearch images, two targets from one file (see docs/scaling.md, "Docker"):
#   docker build --target serve -t metricsearch:serve .   CUDA runtime, `gpu` extra, no torch (small)
#   docker build --target train -t metricsearch:train .   with torch, for training and export
# Both run as the non-root user `metricsearch` (uid 10001) with `metricsearch` as the entrypoint. Without a GPU
# the serve image runs on the CPU (onnxruntime and faiss fall back by themselves).
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends "python3=3.12.*" "python3-venv=3.12.*" \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin metricsearch
WORKDIR /src
COPY . /src/

FROM base AS serve
# The core package brings the CPU builds of onnxruntime and faiss; the GPU builds replace them.
RUN pip install --no-cache-dir "/src[gpu]" \
    && pip uninstall -y onnxruntime faiss-cpu \
    && pip install --no-cache-dir --force-reinstall --no-deps "onnxruntime-gpu>=1.18" "faiss-gpu>=1.7" \
    && rm -rf /src
USER 10001
WORKDIR /data
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/', timeout=4)"]
ENTRYPOINT ["metricsearch"]
CMD ["serve", "--db", "/data/gallery", "--host", "0.0.0.0"]

FROM base AS train
RUN pip install --no-cache-dir "/src[train]" && rm -rf /src
USER 10001
WORKDIR /data
ENTRYPOINT ["metricsearch"]
CMD ["--help"]
