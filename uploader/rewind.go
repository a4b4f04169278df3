package uploader

// Seek moves the image file, for a cloud that must send the data again (Glance
// refused the token just as the upload began): it can then send all of it, and
// the upload's task counts the bytes once.
func (p *progressReader) Seek(offset int64, whence int) (int64, error) {
	n, err := p.r.Seek(offset, whence)
	if err != nil {
		return n, err
	}
	p.done = n
	p.task.Set(n)
	return n, nil
}
