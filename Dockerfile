# Builds a small image of the siphon binary.
FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake pkg-config libssl-dev libcurl4-openssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release -p siphon --locked

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 libcurl4 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 siphon
COPY --from=build /src/target/release/siphon /usr/local/bin/siphon
# Fewer glibc malloc arenas: records freed on the Kafka client's threads stay in per-thread
# arenas otherwise (docs/operations.md, "Flow control and memory").
ENV MALLOC_ARENA_MAX=2
USER siphon
ENTRYPOINT ["/usr/local/bin/siphon"]
CMD ["run", "--config", "/etc/siphon/siphon.toml"]
