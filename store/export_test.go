package store

// What the package's external tests reach that its users do not.

// OpenSQLite opens or creates a SQLite state database alone, as Open does
// for a config without ZooKeeper.
var OpenSQLite = openSQLite

// RemoveFormat removes a build's file of one format and its sidecars.
func (s *Store) RemoveFormat(image, buildID, format string) error {
	return s.removeFormat(image, buildID, format)
}
