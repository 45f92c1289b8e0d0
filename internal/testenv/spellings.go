package testenv

// Spelling is a ClusterIP as a client may write it and the address it holds.
type Spelling struct {
	ClusterIP string // as written in spec.clusterIPs
	Addr      string // the address: the name of its IPAddress object and the bit it sets
}

// ClusterIPSpellings returns the non-canonical ClusterIPs kube-apiserver v1.33 accepts as written
// (its StrictIPCIDRValidation gate off, the default) and stores as written, in 10.96.0.0/24 and
// fd00:10:96::/112, with the address it allocates for each.
func ClusterIPSpellings() []Spelling {
	return []Spelling{
		{"10.96.0.010", "10.96.0.10"},                            // an IPv4 octet with a leading zero, read as decimal
		{"::ffff:10.96.0.11", "10.96.0.11"},                      // IPv4-mapped IPv6: the IPv4 address
		{"FD00:10:96::A", "fd00:10:96::a"},                       // upper case
		{"fd00:10:96:0:0:0:0:b", "fd00:10:96::b"},                // zeros not compressed
		{"fd00:10:96:0000:0000:0000:0000:000c", "fd00:10:96::c"}, // leading zeros in groups
	}
}
