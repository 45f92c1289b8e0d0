// Package bitmaptest provides a bitmap.Store in memory for tests, with hooks that inject
// conflicts, errors, delays and lost responses, as net/http/httptest does for HTTP servers.
//
// It replaces the bitmap.MemStore that used to sit in the bitmap package itself, so that
// production importers of bitmap do not carry test support.
package bitmaptest
