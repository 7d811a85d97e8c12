package broker

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// defaultAddr is used for an empty address: a random loopback port.
const defaultAddr = "127.0.0.1:0"

// listenHostPort splits a listen address for the broker's options. Port 0
// becomes server.RANDOM_PORT, because to the broker 0 means "the default port"
// for the client listener and "disabled" for WebSocket.
func listenHostPort(addr string) (host string, port int, err error) {
	if addr == "" {
		addr = defaultAddr
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err = strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", addr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// AdvertiseAddr is the host:port to put in URLs for a listener bound to host.
// A wildcard bind (":4222", "0.0.0.0", "::") is not an address anyone can
// dial, so URLs name the loopback address instead.
func AdvertiseAddr(host string, port int) string {
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// trimScheme drops "scheme://" from a URL-ish string.
func trimScheme(s string) string {
	if i := strings.Index(s, "://"); i >= 0 {
		return s[i+3:]
	}
	return s
}
