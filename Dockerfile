# tilefarm's service image: the API (`tilefarm serve`) and the workers (`tilefarm worker`) run the same image.
FROM python:3.11-slim

# gcc (with libgomp) links each artifact's kernels into its shared library (compiler/targets/cpu/codegen: $CC, else cc)
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY compiler compiler
COPY tilefarm tilefarm
COPY server server
COPY workers workers
COPY migrations migrations
# extras: "[cuda]" adds ptxas and libdevice for a GPU worker (docker-compose.yml's worker-gpu)
ARG TILEFARM_EXTRAS=""
RUN pip install --no-cache-dir ".${TILEFARM_EXTRAS}" && rm -rf /src

# the folders exist (owned by the user) before the volumes mount on them, so new volumes take that ownership
RUN useradd --create-home --uid 1000 tilefarm \
    && mkdir -p /data/storage /data/tilefarm /data/cache && chown -R tilefarm /data
USER tilefarm
WORKDIR /home/tilefarm
# storage is the volume the API and the workers share; the token file of `tilefarm serve` goes to /data/tilefarm
ENV TILEFARM_STORAGE_DIR=/data/storage XDG_DATA_HOME=/data XDG_CACHE_HOME=/data/cache PYTHONUNBUFFERED=1 CC=gcc
EXPOSE 8000
CMD ["tilefarm", "serve", "--host", "0.0.0.0"]
