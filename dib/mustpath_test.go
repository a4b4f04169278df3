package dib

// mustPath is a path the store gives for a name the test made, which is always
// one of the images-dir.
func mustPath(p string, err error) string {
	if err != nil {
		panic(err)
	}
	return p
}
