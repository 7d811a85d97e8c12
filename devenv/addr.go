package devenv

// defaultAddr is used for an empty address: a random loopback port.
const defaultAddr = "127.0.0.1:0"
