module github.com/celeriac/celeriac

go 1.25.0
