# Both binaries in one static, non-root image:
#   /manager (the operator) and /proxy (the data plane).
# Build: make docker-build IMG=tokenwarden:dev
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY controllers/ controllers/
COPY proxy/ proxy/
COPY main.go ./
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/manager . && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/proxy ./proxy/cmd/proxy

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/manager /out/proxy /
USER 65532:65532
ENTRYPOINT ["/proxy"]
