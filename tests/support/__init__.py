"""What test areas share: waiting on conditions (`waiting`), a clock the test moves (`clock`)."""
