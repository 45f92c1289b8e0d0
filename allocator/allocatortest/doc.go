// Package allocatortest is the conformance suite for allocator.Interface. Every allocator in this
// module passes it, and so should any downstream implementation:
//
//	func TestConformance(t *testing.T) {
//		allocatortest.Run(t, func(t *testing.T, cidr netip.Prefix) allocator.Interface {
//			a, err := myalloc.New(cidr)
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { a.Close() })
//			return a
//		})
//	}
//
// The suite uses small ranges (at most 62 addresses) so that it runs quickly against a real
// kube-apiserver too, and a valid Owner (with a Resource and a Name) in every call. An
// implementation that records owners passes RecordsOwners() to have its rejection of invalid
// owners checked too.
package allocatortest
