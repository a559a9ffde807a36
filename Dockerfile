# metricsearch on CPU: docker build -t metricsearch . && docker run --rm metricsearch train
# For a GPU image, start from an NVIDIA CUDA runtime image and install ".[gpu]" instead.
FROM python:3.11-slim
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir . && useradd -m user
USER user
WORKDIR /home/user
ENTRYPOINT ["metricsearch"]
CMD ["--help"]
