from eaglepatch.cli import main

main()
