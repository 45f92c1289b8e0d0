package bitmap

// persistentOptions holds the settings only Persistent uses.
type persistentOptions struct{}
