# Build the manager binary
FROM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH
ENV GOTOOLCHAIN=local

WORKDIR /workspace
# Copy the Go module manifests first and download the modules, so that
# source changes do not invalidate the cached module layer.
COPY go.mod go.sum ./
RUN go mod download

# Copy the Go source the manager is built from (.dockerignore leaves out
# tests, docs and everything else).
COPY *.go ./
COPY api/ api/
COPY controllers/ controllers/
COPY internal/ internal/
COPY pkg/ pkg/

# Pure Go (no cgo): the binary runs on distroless/static.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} go build -a -o manager .

# Use distroless as minimal base image to package the manager binary.
# Refer to https://github.com/GoogleContainerTools/distroless for more details.
FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /workspace/manager .
USER 65532:65532

ENTRYPOINT ["/manager"]
