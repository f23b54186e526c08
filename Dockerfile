# syntax=docker/dockerfile:1
# kdedup image: build and unit-test on Debian bookworm, run on bookworm-slim
# with only the shared libraries the binary links (scripts/setup --runtime).
#
#   docker build -t kdedup:0.1.0 .
#   docker run --rm -v kdedup-state:/var/lib/kdedup -v $PWD/config:/etc/kdedup:ro \
#     -e KAFKA_BOOTSTRAP=broker:9092 kdedup:0.1.0 run --config /etc/kdedup/kdedup.yaml

FROM debian:bookworm AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY scripts/setup scripts/setup
RUN scripts/setup && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKDEDUP_WERROR=ON \
      -DKDEDUP_BUILD_BENCH=OFF -DCMAKE_INSTALL_PREFIX=/usr/local \
 && cmake --build /build -j"$(nproc)" \
 && ctest --test-dir /build -L unit --output-on-failure -j"$(nproc)" \
 && cmake --install /build --strip

FROM debian:bookworm-slim AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
# Where the source lives (e.g. --build-arg SOURCE=<repository URL>); empty by default.
ARG SOURCE=""
LABEL org.opencontainers.image.title="kdedup" \
      org.opencontainers.image.description="Kafka deduplication service: drops events already delivered within a sliding window" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}"
ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/setup /tmp/setup
RUN /tmp/setup --runtime && rm -rf /var/lib/apt/lists/* /tmp/setup \
 && groupadd --system --gid 10001 kdedup \
 && useradd --system --uid 10001 --gid kdedup --home-dir /var/lib/kdedup --shell /usr/sbin/nologin kdedup \
 && mkdir -p /var/lib/kdedup /etc/kdedup \
 && chown kdedup:kdedup /var/lib/kdedup
COPY --from=build /usr/local/bin/kdedup /usr/local/bin/kdedup
COPY config/kdedup.yaml /etc/kdedup/kdedup.yaml
COPY schemas/config.schema.json /usr/local/share/kdedup/config.schema.json
# RocksDB filter snapshots: mount a persistent volume here.
VOLUME ["/var/lib/kdedup"]
WORKDIR /var/lib/kdedup
USER 10001:10001
EXPOSE 9464
# kdedup handles SIGTERM: finish in-flight records, commit, snapshot, exit
# (bounded by shutdown_timeout). Exec form: kdedup is PID 1 and gets the signal.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kdedup"]
CMD ["run", "--config", "/etc/kdedup/kdedup.yaml"]
