module posenc.local/client

go 1.19
