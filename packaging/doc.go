// Package packaging tests the forms the builder ships in, as an operator
// installs them: the Debian package (make deb) and the container image (make image).
package packaging
