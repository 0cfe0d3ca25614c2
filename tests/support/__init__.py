"""What test areas share: waiting on conditions (`waiting`) and on a job (`jobs`), a clock the test
moves (`clock`)."""
