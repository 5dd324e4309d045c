from eaglepatch.entry import main

main()
