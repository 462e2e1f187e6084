# The ip-masq-agent image: one static binary on a minimal base. No shell, no
# iptables, no nft: the agent speaks netlink itself.
#
# The binary is built on the host, not in a builder stage: `make image`
# cross-compiles bin/linux-$ARCH/ip-masq-agent (CGO_ENABLED=0, -trimpath)
# and this file only copies it in. So the image builds offline (no golang
# image to pull), the binary is the one `make test` tested, and a multi-arch
# build (`make image-multiarch`) needs no emulation: each platform picks its
# own prebuilt binary through TARGETARCH, which docker buildx, podman and
# buildah all set from --platform.
#
# BASE_IMAGE defaults to distroless static (CA certificates, tzdata and
# /etc/passwd; no shell, no package manager). Any base works, scratch too:
# the agent needs no file of its own base, and the user is numeric.

ARG BASE_IMAGE=gcr.io/distroless/static-debian12

FROM ${BASE_IMAGE}

ARG TARGETARCH
ARG VERSION=dev
ARG REVISION=unknown

LABEL org.opencontainers.image.title="ip-masq-agent-nft" \
      org.opencontainers.image.description="nftables-native ip-masq-agent: masquerades pod traffic leaving the cluster, configured by the ip-masq-agent ConfigMap" \
      org.opencontainers.image.source="https://github.com/ip-masq-agent/ip-masq-agent-nft" \
      org.opencontainers.image.url="https://github.com/ip-masq-agent/ip-masq-agent-nft" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

COPY bin/linux-${TARGETARCH}/ip-masq-agent /ip-masq-agent

# Root, on purpose. The agent needs CAP_NET_ADMIN in the node's network
# namespace and nothing else; the DaemonSet drops every capability but that
# one and sets allowPrivilegeEscalation: false (no_new_privs). A non-root
# user would need the capability as an ambient or file capability: Kubernetes
# does not raise ambient capabilities, and no_new_privs makes the kernel
# ignore file capabilities at exec. So uid 0 with a single capability, a
# read-only root filesystem and RuntimeDefault seccomp, as kube-proxy and
# other node agents run. Numeric, so that no /etc/passwd is needed.
USER 0:0

ENTRYPOINT ["/ip-masq-agent"]
